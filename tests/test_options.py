"""The option table (zmqpush.OPTION_GROUPS) drives argparse, the ZMQPUSH_* twins,
the defaults and the simple cross-checks: most tests here call parse_options
directly (milliseconds); the help tests run the installed command."""
import os
import re
import subprocess

import pytest
import zmq.auth

import zmqpush
from conftest import ZMQPUSH

HELP_LINES = 60  # --help fits a screen
ENDPOINT = "tcp://127.0.0.1:9"


def listed_options(text: str) -> set:
    """Every option string a help text lists at the start of an entry."""
    listed = set()
    for line in text.splitlines():
        if re.match(r"\s{2}-", line):
            names = re.split(r"\s{2,}", line.strip())[0]
            listed.update(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", names))
    return listed


def helped(option: str) -> str:
    """The installed command's help (option: --help or --help-all) at 80 columns."""
    proc = subprocess.run([ZMQPUSH, option], capture_output=True, timeout=30,
                          env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr
    return proc.stdout.decode()


def test_help_all_lists_every_option_of_the_parser():
    parser = zmqpush.build_parser()
    every = {name for action in parser._actions for name in action.option_strings}
    assert len(every) > 50
    assert listed_options(helped("--help-all")) == every


def test_help_fits_a_screen_and_says_where_the_rest_is():
    text = helped("--help")
    assert len(text.splitlines()) <= HELP_LINES
    common = {name for option in zmqpush.OPTIONS if option.common and option.kind != "positional"
              for name in option.flags}
    assert listed_options(text) == common | {"-h", "--help", "--help-all", "--version"}
    assert "--help-all" in text.split("\n\n")[-1]


def test_help_examples_use_only_listed_options_and_tail_without_a_repeat():
    text = helped("--help")
    examples = text.split("\nexamples")[1].split("\n\n")[0]
    assert set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", examples)) - {"-n0", "-F"} \
        <= listed_options(text)
    assert "tail -n0 -F" in examples and "tail -F" not in examples


def test_help_all_names_the_options_without_environment_twin_and_rsyslogs_must():
    text = helped("--help-all")
    sentence = " ".join(text.split("Every option except")[1].split(")")[0].split())
    no_twin = {name for action in zmqpush.build_parser()._actions for name in action.option_strings
               if name.startswith("--") and zmqpush.option_dest(name).upper()
               not in {o.dest.upper() for o in zmqpush.OPTIONS if o.twin}}
    assert set(re.findall(r"--[a-z-]+", sentence)) == no_twin
    assert 'forceSingleInstance="on"' in text.split("rsyslog (RainerScript)")[1]


@pytest.mark.parametrize("args, pointer", [
    (["--metrics-file", "/nonexistent-dfx/m.prom"], "(see --help-all)"),
    (["--linger", "x"], "(see --help)"),
])
def test_usage_error_points_to_the_help_that_lists_the_option(args, pointer):
    proc = subprocess.run([ZMQPUSH, *args], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.decode().rstrip().endswith(pointer), proc.stderr


@pytest.mark.parametrize("failures, fixed, part", [
    (0, 0, ""),
    (1, 0, ". 1 line was not a JSON object and went as text (@json_error says why)"),
    (2, 1, ". 2 lines were not JSON objects and went as text; 1 event had a field moved "
     "or noted (@json_error says why)"),
    (0, 3, ". 3 events had a field moved or noted (@json_error says why)"),
])
def test_json_closing_counts_in_plain_words(failures, fixed, part):
    assert zmqpush.json_closing(failures, fixed) == part


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict:
    """A server's and a client's certificates, and a directory of client certificates."""
    base = tmp_path_factory.mktemp("certs")
    server_public, server_secret = zmq.auth.create_certificates(str(base), "server")
    client_public, client_secret = zmq.auth.create_certificates(str(base), "client")
    for secret in (server_secret, client_secret):
        os.chmod(secret, 0o600)
    clients = base / "clients"
    clients.mkdir()
    (clients / "client.key").write_bytes(open(client_public, "rb").read())
    return {"server": server_public, "server_secret": server_secret,
            "client_secret": client_secret, "clients": str(clients), "dir": str(base)}


def samples(certs: dict) -> dict:
    """Per option (its last flag): (options it needs, a value other than its
    default, None for a switch) for each option with a twin."""
    spool = ["--spool", certs["dir"] + "/spool"]
    joined = ["--multiline", "python"]
    return {
        "logtype": ([], "app"),
        "--connect": ([], ENDPOINT), "--bind": ([], ENDPOINT), "--heartbeat": ([], "5"),
        "--stdout": ([], None),
        "--linger": ([], "2"), "--replay-bytes": ([], "100000"),
        "--queue-bytes": ([], "100000"), "--when-full": ([], "drop"),
        "--memory-bytes": ([], "50000000"), "--sndhwm": ([], "7"),
        "--write-buffer-limits": ([], "100,5"), "--max-line-bytes": ([], "1000"),
        "--batch": ([], None), "--batch-bytes": (["--batch"], "5000"),
        "--coalesce": ([], "0.5"), "--host-field": ([], None), "--host-field-ecs": ([], None),
        "--timestamp": ([], None), "--field": ([], "a=1"), "--event-id": ([], None),
        "--json": ([], None), "--json-target": (["--json"], "t"),
        "--json-message-key": (["--json"], "m"), "--json-overwrite": (["--json"], None),
        "--journal": ([], None), "--docker": ([], None), "--cri": ([], None),
        "--stats": ([], "3"), "--stats-format": ([], "json"),
        "--progress": ([], None), "--quiet": ([], None),
        "--metrics-file": ([], certs["dir"] + "/m.prom"),
        "--metrics-listen": ([], "127.0.0.1:9100"), "--metrics-name": ([], "n"),
        "--confirm": ([], None), "--confirm-timeout": (["--confirm"], "0"),
        "--curve-server-cert": (["-c", ENDPOINT, "--curve-cert", certs["client_secret"]],
                                certs["server"]),
        "--curve-cert": (["-c", ENDPOINT, "--curve-server-cert", certs["server"]],
                         certs["client_secret"]),
        "--curve-clients": (["--bind", ENDPOINT, "--curve-cert", certs["server_secret"]],
                            certs["clients"]),
        "--allow": (["--bind", ENDPOINT], "127.0.0.1"),
        "--spool": ([], spool[1]), "--spool-bytes": (spool, "2000000"),
        "--spool-sync": (spool, "never"),
        "--multiline": ([], "python"), "--multiline-pattern": ([], "^x"),
        "--multiline-negate": (["--multiline-pattern", "^x"], None),
        "--multiline-match": (["--multiline-pattern", "^x"], "before"),
        "--multiline-max-lines": (joined, "9"), "--multiline-max-bytes": (joined, "100"),
        "--multiline-timeout": (joined, "0.5"),
        "--multiline-source": (["--json", *joined], "a,b"),
    }


def on_command_line(option: zmqpush.Option, value) -> list:
    """The arguments that give option this value (None: a switch)."""
    if option.kind == "positional":
        return [value]
    return [option.flags[-1]] + ([] if value is None else [value])


def test_every_environment_twin_sets_what_its_option_sets(certs):
    known = samples(certs)
    twins = [option for option in zmqpush.OPTIONS if option.twin]
    assert {option.flags[-1] for option in twins} == set(known), "an option without a sample"
    for option in twins:
        context, value = known[option.flags[-1]]
        given = zmqpush.parse_options(context + on_command_line(option, value), {})
        twin = zmqpush.parse_options(context, {option.twin: "yes" if value is None else value})
        assert twin == given, option.flags
        assert given != without(context), option.flags


def without(context: list):
    """The Config of these arguments alone, None if they are refused."""
    try:
        return zmqpush.parse_options(context, {})
    except zmqpush.UsageError:
        return None


def test_the_default_config_holds_the_table_defaults():
    config = zmqpush.parse_options([], {})
    derived = {"connect", "bind", "sndhwm", "replay_bytes", "multiline", "logtype"}
    checked = 0
    for option in zmqpush.OPTIONS:
        if option.dest in config._fields and option.dest not in derived:
            expected = False if option.kind == "switch" else option.default
            assert getattr(config, option.dest) == expected, option.dest
            checked += 1
    assert checked > 20
    assert config.logtype == b"syslog"


def usage_error(argv: list, environ=None) -> str:
    with pytest.raises(zmqpush.UsageError) as caught:
        zmqpush.parse_options(argv, environ or {})
    return str(caught.value)


def give(spec: str, known: dict) -> list:
    """The arguments of spec ("--name" or "--name VALUE"), a sample value if it takes one."""
    flag, _, value = spec.partition(" ")
    value = value or known[flag][1]
    return [flag] + ([value] if value is not None else [])


def with_needs(option: zmqpush.Option, known: dict, needs: tuple) -> list:
    """option with its sample value, and the first option of each of these groups."""
    return [arg for group in needs for arg in give(group[0], known)] + on_command_line(
        option, known[option.flags[-1]][1])


def test_each_need_of_the_table_is_checked(certs):
    known = samples(certs)
    checked = 0
    for option in zmqpush.OPTIONS:
        for i, alternatives in enumerate(option.needs):
            args = with_needs(option, known, option.needs[:i])
            assert usage_error(args) == (f"{option.flags[-1]} needs "
                                         f"{' or '.join(alternatives)}"), args
            for spec in alternatives:  # any one of them will do
                zmqpush.parse_options(with_needs(option, known, (
                    *option.needs[:i], (spec,), *option.needs[i + 1:])), {})
            checked += 1
    assert checked >= 8


def test_each_conflict_of_the_table_is_checked(certs):
    known = samples(certs)
    checked = 0
    for option in zmqpush.OPTIONS:
        for spec, why in option.conflicts:
            assert why, f"{option.flags[-1]} and {spec}: a refusal says why"
            args = with_needs(option, known, option.needs) + give(spec, known)
            assert usage_error(args) == (f"{option.flags[-1]} and {spec} cannot be combined"
                                         + (f" ({why})" if why else "")), args
            checked += 1
    assert checked >= 5


@pytest.mark.parametrize(("argv", "said"), [
    (["--confirm", "--batch"], "--confirm and --batch cannot be combined"
     " (rsyslog writes a line only once the last is answered: every array would hold one line)"),
    (["--confirm", "--when-full", "drop"],
     "--confirm and --when-full drop cannot be combined (every line read needs a reply)"),
    (["--json", "--journal"], "--json and --journal cannot be combined (--journal parses JSON)"),
    (["--host-field", "--host-field-ecs"], "--host-field and --host-field-ecs cannot be combined"
     ' (one key for the host: "host" or ECS\'s)'),
    (["--multiline", "go", "--multiline-pattern", "x"],
     "--multiline and --multiline-pattern cannot be combined"
     " (one joining rule: presets or a pattern)"),
    (["--multiline-timeout", "1"], "--multiline-timeout needs --multiline or --multiline-pattern"),
    (["--multiline", "go", "--multiline-source", "a"],
     "--multiline-source needs --json or --journal or --docker or --cri"),
    (["--multiline", "go", "--multiline-negate"], "--multiline-negate needs --multiline-pattern"),
    (["--journal", "--json-overwrite"], "--json-overwrite needs --json"),
], ids=["confirm-batch", "confirm-drop", "json-journal", "host-fields", "two-rules",
        "timeout-alone", "source-unstructured", "negate-presets", "overwrite-journal"])
def test_cross_check_messages(argv, said):
    assert usage_error(argv) == said


@pytest.mark.parametrize(("environ", "said"), [
    ({"ZMQPUSH_LINGER": "x"},
     "ZMQPUSH_LINGER: invalid value 'x' (expected number of seconds from 0 to 86400)"),
    ({"ZMQPUSH_WHEN_FULL": "sometimes"},
     "ZMQPUSH_WHEN_FULL: 'sometimes' is not one of block, drop"),
    ({"ZMQPUSH_CONFIRM": "enabled"}, "ZMQPUSH_CONFIRM: invalid value 'enabled'"),
    ({"ZMQPUSH_BATCH": "1", "ZMQPUSH_CONFIRM": "on"}, "--confirm and --batch cannot be combined"
     " (rsyslog writes a line only once the last is answered: every array would hold one line)"),
], ids=["bad-number", "bad-choice", "bad-switch", "twins-conflict"])
def test_twin_errors_name_the_variable(environ, said):
    assert usage_error([], environ) == said


def test_a_switch_its_twin_sets_off_is_not_given():
    config = zmqpush.parse_options([], {"ZMQPUSH_MULTILINE_NEGATE": "0",
                                        "ZMQPUSH_JSON_OVERWRITE": "off"})
    assert config.multiline is None and config.json_overwrite is False


def test_the_command_line_wins_over_the_twin():
    config = zmqpush.parse_options(["--linger", "1", "-f", "a=1"],
                                   {"ZMQPUSH_LINGER": "3", "ZMQPUSH_FIELD": "b=2"})
    assert config.linger == 1 and config.fields == ((b"a", b"1"),)


def test_make_cert_has_no_twin():
    assert zmqpush.parse_options([], {"ZMQPUSH_MAKE_CERT": "/nonexistent/x"}).bind == []


def integer_bounds(option: zmqpush.Option) -> tuple | None:
    """(low, high or None) of an option parsed as a bounded integer, from the
    name its parser shows in usage errors; None for other options."""
    name = getattr(option.parse, "__name__", "")
    ranged = re.fullmatch(r"integer from (\d+) to (\d+)", name)
    if ranged:
        return int(ranged[1]), int(ranged[2])
    if name == "positive integer":
        return 1, None
    least = re.fullmatch(r"integer of at least (\d+)", name)
    return (int(least[1]), None) if least else None


def test_integer_options_take_their_bounds_and_refuse_one_past_them():
    checked = 0
    for option in zmqpush.OPTIONS:
        bounds = integer_bounds(option)
        if bounds is None:
            continue
        low, high = bounds
        assert option.parse(str(low)) == low, option.flags
        with pytest.raises(ValueError):
            option.parse(str(low - 1))
        if high is not None:
            assert option.parse(str(high)) == high, option.flags
            with pytest.raises(ValueError):
                option.parse(str(high + 1))
            checked += 1
    assert checked >= 3

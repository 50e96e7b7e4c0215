/*
 * cship: zmqpush's default job in C, as a reference for the benchmarks.
 *
 *   cship ENDPOINT [LOGTYPE] [--array]
 *
 * Reads stdin with read() in 256 KiB chunks and sends each line over a ZeroMQ
 * PUSH socket connected to ENDPOINT as {"message":LINE,"type":LOGTYPE,"@pid":PID},
 * byte for byte what zmqpush sends by default: the line is decoded as UTF-8 with
 * every invalid sequence replaced by U+FFFD (Python's errors="replace": one U+FFFD
 * per maximal subpart), then escaped as Python's json c_encode_basestring does
 * ('"', '\', \b \f \n \r \t, other controls as \u00xx; DEL and non-ASCII kept).
 * One '\n' ends a line and one '\r' before it is dropped; a last line without a
 * newline is sent at EOF as it is.  One zmq_send per line, or with --array one
 * message per read holding a JSON array of that read's complete lines.
 * LINGER -1 (close waits for delivery), SNDHWM left at its default.
 *
 * Unlike zmqpush it has no --max-line-bytes: a long line is held and sent whole.
 * Build: cc -O2 -o cship cship.c -lzmq
 */
#define _GNU_SOURCE     /* memrchr */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#define READ_BYTES (256 * 1024)
#define HEAD "{\"message\":\""
#define HEAD_LEN (sizeof(HEAD) - 1)

/* 1 for bytes that cannot be copied as they are: controls, '"', '\', non-ASCII. */
static unsigned char special[256];

static void init_special(void)
{
    for (int c = 0; c < 256; c++)
        special[c] = c < 0x20 || c == '"' || c == '\\' || c >= 0x80;
}

/* Any byte of the word < 0x20, == '"', == '\\' or >= 0x80 (SWAR, per byte exact
 * enough to be used only as "maybe": a false positive just takes the slow path). */
static inline int word_special(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t quote = x ^ (ones * '"'), bslash = x ^ (ones * '\\');
    uint64_t t = (x - ones * 0x20) | (quote - ones) | (bslash - ones) | x;
    return (t & high) != 0;
}

/* Length of the UTF-8 sequence at s (n > 0 bytes left, s[0] >= 0x80).  Sets *ok
 * when it is a valid character; otherwise the result is the length of its
 * maximal subpart (at least 1), which Python replaces by one U+FFFD. */
static inline size_t utf8_sequence(const unsigned char *s, size_t n, int *ok)
{
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t need, k;

    *ok = 0;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;          /* no overlong forms */
        else if (c == 0xED)
            hi = 0x9F;          /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;          /* no overlong forms */
        else if (c == 0xF4)
            hi = 0x8F;          /* nothing above U+10FFFF */
    } else {
        return 1;               /* continuation byte, C0, C1 or F5..FF */
    }
    for (k = 1; k <= need; k++) {
        if (k >= n)
            return k;
        if (s[k] < lo || s[k] > hi)
            return k;
        lo = 0x80;
        hi = 0xBF;
    }
    *ok = 1;
    return k;
}

/* JSON-escape n bytes of s into out (room for 6 * n bytes); returns the end. */
static unsigned char *escape(const unsigned char *s, size_t n, unsigned char *out)
{
    static const char hex[] = "0123456789abcdef";
    size_t i = 0;

    while (i < n) {
        size_t j = i;
        uint64_t w;
        while (j + 8 <= n) {
            memcpy(&w, s + j, 8);
            if (word_special(w))
                break;
            j += 8;
        }
        while (j < n && !special[s[j]])
            j++;
        memcpy(out, s + i, j - i);
        out += j - i;
        i = j;
        if (i >= n)
            break;
        unsigned c = s[i];
        if (c >= 0x80) {
            int ok;
            size_t len = utf8_sequence(s + i, n - i, &ok);
            if (ok) {
                memcpy(out, s + i, len);
                out += len;
            } else {
                *out++ = 0xEF;
                *out++ = 0xBF;
                *out++ = 0xBD;
            }
            i += len;
            continue;
        }
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        default:
            *out++ = 'u';
            *out++ = '0';
            *out++ = '0';
            *out++ = hex[c >> 4];
            *out++ = hex[c & 15];
        }
        i++;
    }
    return out;
}

static void *xrealloc(void *p, size_t size)
{
    p = realloc(p, size);
    if (!p) {
        fputs("cship: out of memory\n", stderr);
        exit(1);
    }
    return p;
}

struct shipper {
    void *sock;
    int array;
    unsigned char tail[16 + 6 * 512 + 32];      /* ","type":"…","@pid":N} */
    size_t tail_len;
    unsigned char *out;
    size_t out_size;
};

static void send_bytes(struct shipper *sh, const unsigned char *data, size_t len)
{
    while (zmq_send(sh->sock, data, len, 0) < 0) {
        if (errno == EINTR)
            continue;
        fprintf(stderr, "cship: zmq_send: %s\n", zmq_strerror(errno));
        exit(1);
    }
}

/* Room for n more bytes after the first used bytes of the output buffer. */
static void reserve(struct shipper *sh, size_t used, size_t n)
{
    if (used + n > sh->out_size) {
        sh->out_size = 2 * (used + n);
        sh->out = xrealloc(sh->out, sh->out_size);
    }
}

/* Append one event for line[0..len) at out[used]; returns the new used. */
static size_t put_event(struct shipper *sh, size_t used, const unsigned char *line, size_t len)
{
    reserve(sh, used, HEAD_LEN + 6 * len + sh->tail_len + 2);
    unsigned char *o = sh->out + used;
    memcpy(o, HEAD, HEAD_LEN);
    o = escape(line, len, o + HEAD_LEN);
    memcpy(o, sh->tail, sh->tail_len);
    return o + sh->tail_len - sh->out;
}

/* Ship the lines in buf[0..n): each ends in '\n' when complete is set; otherwise
 * buf holds one last line without a newline (EOF), sent as it is. */
static void ship(struct shipper *sh, const unsigned char *buf, size_t n, int complete)
{
    const unsigned char *p = buf, *end = buf + n;
    size_t used = 0;

    while (p < end) {
        const unsigned char *nl = complete ? memchr(p, '\n', end - p) : end;
        size_t len = nl - p;
        if (complete && len && p[len - 1] == '\r')
            len--;
        if (sh->array) {
            reserve(sh, used, 1);
            sh->out[used] = used ? ',' : '[';
            used++;
            used = put_event(sh, used, p, len);
        } else {
            used = put_event(sh, 0, p, len);
            send_bytes(sh, sh->out, used);
        }
        p = complete ? nl + 1 : end;
    }
    if (sh->array && used) {
        sh->out[used++] = ']';     /* put_event left room for it */
        send_bytes(sh, sh->out, used);
    }
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *logtype = "syslog";
    struct shipper sh = {0};
    int positional = 0, linger = -1;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--array") == 0)
            sh.array = 1;
        else if (positional == 0 && ++positional)
            endpoint = argv[i];
        else if (positional == 1 && ++positional)
            logtype = argv[i];
        else
            endpoint = NULL, i = argc;
    }
    if (!endpoint || strlen(logtype) > 512) {
        fputs("usage: cship ENDPOINT [LOGTYPE] [--array]\n", stderr);
        return 2;
    }
    init_special();
    {
        unsigned char *t = sh.tail;
        memcpy(t, "\",\"type\":\"", 10);
        t = escape((const unsigned char *)logtype, strlen(logtype), t + 10);
        t += sprintf((char *)t, "\",\"@pid\":%ld}", (long)getpid());
        sh.tail_len = t - sh.tail;
    }

    void *ctx = zmq_ctx_new();
    sh.sock = zmq_socket(ctx, ZMQ_PUSH);
    zmq_setsockopt(sh.sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(sh.sock, endpoint) < 0) {
        fprintf(stderr, "cship: %s: %s\n", endpoint, zmq_strerror(errno));
        return 2;
    }

    size_t size = 2 * READ_BYTES, held = 0;
    unsigned char *buf = xrealloc(NULL, size);
    for (;;) {
        if (size - held < READ_BYTES) {
            size *= 2;          /* a line longer than what is held: keep it whole */
            buf = xrealloc(buf, size);
        }
        ssize_t got = read(0, buf + held, READ_BYTES);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            perror("cship: read");
            return 1;
        }
        if (got == 0)
            break;
        /* Complete lines: up to the last newline (held bytes have none). */
        unsigned char *nl = memrchr(buf + held, '\n', got);
        held += got;
        if (!nl)
            continue;
        size_t done = nl + 1 - buf;
        ship(&sh, buf, done, 1);
        held -= done;
        memmove(buf, buf + done, held);
    }
    if (held)
        ship(&sh, buf, held, 0);
    free(buf);
    free(sh.out);
    zmq_close(sh.sock);
    zmq_ctx_term(ctx);
    return 0;
}

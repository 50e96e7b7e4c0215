"""Install zmqpush.py and zmqpush-watermark.py on PATH (README "Install")."""
from setuptools import setup

from zmqpush import __version__

setup(
    name="zmqpush",
    version=__version__,
    description="Ship log lines from stdin to Logstash over a ZeroMQ PUSH socket, as JSON",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    py_modules=["zmqpush"],
    scripts=["zmqpush.py", "zmqpush-watermark.py"],
    python_requires=">=3.9",
    # Lower bounds are the versions the test suite runs against (.ci/run).
    install_requires=["pyzmq>=27.0", "aiozmq>=1.0.0", "uvloop>=0.21"],
    extras_require={"test": ["pytest>=8", "hypothesis>=6.100"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Topic :: System :: Logging",
    ],
)

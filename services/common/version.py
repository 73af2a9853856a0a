"""Package version, reported by GetInfo and `trinity --version`."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trinity-grpc")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+source"

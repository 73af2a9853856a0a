# The trinity-grpc image with systemd as PID 1, for tests/deploy/test_systemd.py: the package is
# already in /opt/trinity-grpc/.venv (where the units expect it); the test installs the units.
# The locally made base has systemd; on the official python:3.11-slim base apt installs it.
ARG IMAGE=trinity-grpc:cpu
FROM ${IMAGE}
USER root
RUN command -v systemctl > /dev/null \
 || (apt-get update && apt-get install -y --no-install-recommends systemd-sysv dbus && rm -rf /var/lib/apt/lists/*)
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT []
CMD ["/lib/systemd/systemd"]

# The jobpool package in a Python image: `jobpool worker`, `jobpool supervisor` and the admin CLI.
# Workers and the supervisor talk to the host's Docker daemon through a mounted /var/run/docker.sock.
#
#   docker build -t jobpool:latest .                        (the base image pulled from a registry)
#   pip wheel --wheel-dir wheelhouse . hatchling            (no registry: wheels made on the host, then)
#   docker build --build-arg BASE=my-debian-python -t jobpool:latest .
#
# BASE: any image with python3 >= 3.10 and its venv module (Debian: python3 python3-venv). With a
# `wheelhouse/` directory in the build context, nothing is downloaded: pip installs from it alone
# (--no-index), so its wheels must match the base's Python version and platform. jobpool goes into a venv
# (/opt/jobpool): a distribution's own Python refuses pip installs into its system site (PEP 668).
# One COPY and one RUN: each layer is a whole copy of the file system under the vfs storage driver.
ARG BASE=python:3.11-slim
FROM ${BASE}
COPY . /src/
RUN set -eu; \
    if [ -d /src/wheelhouse ]; then set -- --no-index --find-links /src/wheelhouse; fi; \
    python3 -m venv /opt/jobpool; \
    /opt/jobpool/bin/pip install --no-cache-dir --disable-pip-version-check "$@" /src; \
    rm -rf /src
ENV PATH=/opt/jobpool/bin:$PATH
ENTRYPOINT ["jobpool"]
CMD ["--help"]

# The jobpool package in a slim Python image: `jobpool worker`, `jobpool supervisor` and the admin CLI.
# Workers and the supervisor talk to the host's Docker daemon through a mounted /var/run/docker.sock.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY jobpool ./jobpool
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
ENTRYPOINT ["jobpool"]
CMD ["--help"]

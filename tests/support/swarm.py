"""A real Docker Swarm of private dockerd daemons on this one machine (tests/integration/test_swarm_stack.py).

Each node is a `DockerDaemon` (servers.py) of its own: its own socket, data root and exec root. What a Swarm
of them on one kernel needs, each found by trying:

- **No live-restore.** dockerd refuses `swarm init` and `swarm join` while live-restore is on ("--live-restore
  daemon configuration is incompatible with swarm mode", and a daemon that is in a Swarm refuses to start
  with it), so every node runs without it, as every real Swarm node does.
- **An address of its own per node** (127.0.0.2, 127.0.0.3, ...): the Swarm ports (2377, gossip) are bound
  on the advertised address, so two nodes cannot share one.
- **No overlay network.** Every node's daemon is in the one network namespace of this machine, and the
  overlay driver makes its VXLAN interfaces and `docker_gwbridge` there under names that depend only on the
  network: the second node's task is rejected ("error creating vxlan interface: file exists"). The stack's
  services therefore run on the host network here (`host_network_override`), which on one machine connects
  them just as well; a real Swarm keeps the stack's overlay network.
- **A socket per node at one path template.** All nodes share one file system, so the stack's socket mount
  (`JOBPOOL_DOCKER_SOCKET`) is given as `<dir>/{{.Node.ID}}.sock`: Swarm expands the template per task, and
  each name is a symlink to that node's daemon socket (`socket_template`).
- **No registry.** Images are loaded into every node (tests/support/images.py, `load_into`) and the stack is
  deployed with `--resolve-image never`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.servers import DockerDaemon


def docker_cli() -> str | None:
    """The `docker` command line (its `stack deploy` turns a compose file into services; the SDK has none)."""
    return shutil.which("docker")


GWBRIDGE = Path("/sys/class/net/docker_gwbridge")


def overlay_mounts() -> bool:
    """Whether this kernel mounts overlays, so a node can store images with overlay2: a stack's image is
    then unpacked once per node and shared by its containers, where vfs copies all of it for each layer and
    again for each container (a minute of the module's time with jobpool's image)."""
    with contextlib.suppress(OSError):
        listed = Path("/proc/filesystems").read_text().splitlines()
        return any(line.split()[-1] == "overlay" for line in listed if line.strip())
    return False


class Swarm:
    """`nodes` private daemons in one Swarm: the first is its only manager, the rest join as workers."""

    def __init__(self, nodes: int = 2) -> None:
        if not 2 <= nodes <= 8:
            raise ValueError("a Swarm here has 2 to 8 nodes")
        driver = "overlay2" if overlay_mounts() else "vfs"
        self.daemons = [DockerDaemon(live_restore=False, swarm_addr=f"127.0.0.{i + 2}", storage_driver=driver)
                        for i in range(nodes)]
        # Short and under /tmp, as the daemons' own dirs: a socket path is limited to ~107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="jpsw-", dir="/tmp"))
        self.node_ids: list[str] = []
        #: Swarm's nodes make a bridge `docker_gwbridge` in the network namespace they share, and leave it
        #: behind; it is removed on close only when this Swarm made it (a system Docker may own one).
        self._gwbridge_ours = not GWBRIDGE.exists()

    @property
    def manager(self) -> DockerDaemon:
        return self.daemons[0]

    def start(self) -> None:
        """Start every daemon, make the first the manager, join the others, link each node's socket."""
        for daemon in self.daemons:
            daemon.start()
        with contextlib.closing(self.manager.client()) as client:
            addr = self.manager.swarm_addr
            client.swarm.init(listen_addr=f"{addr}:2377", advertise_addr=addr)
            token = client.swarm.attrs["JoinTokens"]["Worker"]
        for daemon in self.daemons[1:]:
            with contextlib.closing(daemon.client()) as client:
                client.swarm.join(
                    remote_addrs=[f"{addr}:2377"], join_token=token,
                    listen_addr=f"{daemon.swarm_addr}:2377", advertise_addr=daemon.swarm_addr,
                )
        for daemon in self.daemons:
            with contextlib.closing(daemon.client()) as client:
                node_id = str(client.info()["Swarm"]["NodeID"])
            self.node_ids.append(node_id)
            (self.dir / f"{node_id}.sock").symlink_to(daemon.dir / "docker.sock")

    @property
    def socket_template(self) -> str:
        """The stack's `JOBPOOL_DOCKER_SOCKET`: each task mounts its own node's daemon socket."""
        return f"{self.dir}/{{{{.Node.ID}}}}.sock"

    def daemon_of(self, node_id: str) -> DockerDaemon:
        return self.daemons[self.node_ids.index(node_id)]

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
        """Run `docker ARGS` against the manager; its output, or CalledProcessError with what it printed."""
        cli = docker_cli()
        if cli is None:
            raise FileNotFoundError("the docker command line is not on PATH (apt-get install docker.io)")
        run_env = {**os.environ, **(env or {}), "DOCKER_HOST": self.manager.host}
        done = subprocess.run([cli, *args], env=run_env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        return done.stdout

    def deploy(self, stack: str, files: list[Path], env: dict[str, str]) -> None:
        """`docker stack deploy` of `files` (later ones override earlier ones), images as loaded."""
        args = ["stack", "deploy", "--resolve-image", "never"]
        for path in files:
            args += ["-c", str(path)]
        self.cli(*args, stack, env=env)

    def tasks(self, service: str) -> list[dict[str, Any]]:
        """The Swarm tasks of `service` (stack name included), as the manager lists them."""
        with contextlib.closing(self.manager.client()) as client:
            return list(client.services.get(service).tasks())

    def running_tasks(self, service: str) -> dict[str, str]:
        """node ID -> container ID of each task of `service` the manager sees running."""
        return {
            task["NodeID"]: task["Status"]["ContainerStatus"]["ContainerID"]
            for task in self.tasks(service)
            if task["Status"]["State"] == "running" and task["DesiredState"] == "running"
        }

    def set_availability(self, node_id: str, availability: str) -> None:
        """`docker node update --availability`: active; pause (no new task placed there); drain (its tasks
        stopped, none placed there)."""
        with contextlib.closing(self.manager.client()) as client:
            node = client.nodes.get(node_id)
            node.update({**node.attrs["Spec"], "Availability": availability})

    def close(self) -> None:
        """Leave the Swarm on every running node (workers first), then close every daemon."""
        for daemon in reversed(self.daemons):
            with contextlib.suppress(Exception), contextlib.closing(daemon.client(timeout=30)) as client:
                if daemon.running:
                    client.swarm.leave(force=True)
        with ThreadPoolExecutor(len(self.daemons)) as closing:  # each deletes its own data root
            list(closing.map(DockerDaemon.close, self.daemons))
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._gwbridge_ours and GWBRIDGE.exists():
            subprocess.run(["ip", "link", "delete", GWBRIDGE.name], check=False, capture_output=True)

    def __enter__(self) -> Swarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

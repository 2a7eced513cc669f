"""Images made without a registry: a Debian base and jobpool's own image, for tests that run jobpool in
containers (the compose fleet, a swarm).

Nothing can be pulled from a registry on the test machines, so both images are made from what can be had:
Debian's packages and PyPI's. Use, with a started `DockerDaemon` (tests/support/servers.py):

    from tests.support import images
    tag = images.jobpool_image(daemon)   # jobpool built from this repo's Dockerfile; makes the base if needed
    base = images.base_image(daemon)     # Debian 12 minbase + python3, python3-venv, redis-server
    images.load_into(tag, daemon, other_daemon)   # the same image on a second daemon (docker save | load)

Each returns (or takes) an image tag on that daemon and does nothing when the daemon has it already, so a
session-scoped fixture calls it once and every test shares the result. The slow parts are cached outside the
repository, in `CACHE_DIR` (/var/cache/jobpool-tests, or $JOBPOOL_TEST_CACHE), across runs and sessions:

- the base's root file system, as a tarball made by `debootstrap` (the slowest step by far), keyed by
  release and package list; `docker import` turns it into an image;
- a wheelhouse (`pip wheel` of this repo's dependencies and its build backend, made on the host from PyPI),
  keyed by pyproject.toml and the Python version: the image is then built with no network at all.

The base's Python is Debian 12's 3.11.2: its wheels are made by a Python of that very version on the host.
A file lock per cached item makes concurrent sessions build it once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker

from tests.support.servers import DockerDaemon

ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("JOBPOOL_TEST_CACHE", "/var/cache/jobpool-tests"))

#: Debian 12: its python3 is the 3.11 the wheelhouse is made for.
RELEASE = "bookworm"
#: python3-venv for the Dockerfile's venv (it brings pip's own wheel for ensurepip); redis-server, so the
#: compose file's Redis runs from the same base (redis-cli, its healthcheck, comes with it).
BASE_PACKAGES = ("python3", "python3-venv", "redis-server")
#: What an image never needs and costs a full copy per layer and per container under vfs: package caches and
#: lists, documentation, translations.
_TRIMMED = ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info",
            "usr/share/locale")
_PRINT_VERSION = "import platform; print(platform.python_version())"
#: What goes into the jobpool image's build context besides the wheelhouse (the repo's .dockerignore keeps
#: the same set for a plain `docker build .`).
_CONTEXT = ("Dockerfile", "pyproject.toml", "README.md", "jobpool")


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """An exclusive lock on a cache item, so two sessions never make the same one at once."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _need(tool: str, package: str) -> str:
    """The path of `tool`, installing its Debian package first when missing (the tests run as root)."""
    found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True, env=env, capture_output=True)
    found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if not found:
        raise FileNotFoundError(f"{tool} not found after apt-get install {package}")
    return found


def _base_key() -> str:
    return _digest(RELEASE.encode(), " ".join(sorted(BASE_PACKAGES)).encode(), " ".join(_TRIMMED).encode())


def _apt_mirror(apt: Path = Path("/etc/apt")) -> str | None:
    """The mirror this host's apt fetches `RELEASE` from (a machine that reaches only its own mirror reaches
    it for debootstrap too); None: debootstrap's default. Reads deb822 `.sources` files and one-line lists."""
    for path in sorted((apt / "sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            lines = [line.split(":", 1) for line in stanza.splitlines() if ":" in line and line[0] != "#"]
            fields = {name.strip(): value.split() for name, value in lines}
            uris = fields.get("URIs")
            if uris and RELEASE in fields.get("Suites", []) and "deb" in fields.get("Types", []):
                return uris[0]
    lists = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]
    for path in (p for p in lists if p.exists()):
        for words in (line.split() for line in path.read_text().splitlines()):
            options = 1 if len(words) > 1 and words[1].startswith("[") else 0  # deb [signed-by=...] URI
            if len(words) >= 3 + options and words[0] == "deb" and words[2 + options] == RELEASE:
                return words[1 + options]
    return None


def _rootfs() -> tuple[Path, Path]:
    stem = CACHE_DIR / f"rootfs-{RELEASE}-{_base_key()}"
    return stem.with_suffix(".tar"), stem.with_suffix(".python")


def rootfs_tarball() -> Path:
    """The cached tarball of a Debian minbase root file system with `BASE_PACKAGES`, made once (with, beside
    it, the full version of its python3: `base_python_version`)."""
    path, version = _rootfs()
    with _locked(path.name):
        if path.exists() and version.exists():
            return path
        debootstrap = _need("debootstrap", "debootstrap")
        mirror = os.environ.get("JOBPOOL_TEST_DEBIAN_MIRROR") or _apt_mirror()
        work = Path(tempfile.mkdtemp(prefix="jp-rootfs-", dir=CACHE_DIR))
        try:
            root = work / "root"
            result = subprocess.run(
                [debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", RELEASE, str(root),
                 *([mirror] if mirror else [])],
                capture_output=True, text=True, check=False,
            )
            if result.returncode:
                raise RuntimeError(f"debootstrap failed ({result.returncode}):\n{result.stdout[-3000:]}"
                                   f"{result.stderr[-2000:]}")
            for rel in _TRIMMED:
                shutil.rmtree(root / rel, ignore_errors=True)
            (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
            (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
            version.write_text(subprocess.run(["chroot", str(root), "python3", "-c", _PRINT_VERSION],
                                              capture_output=True, text=True, check=True).stdout)
            partial = work / "rootfs.tar"
            # Docker makes /dev, /proc and /sys of its own in every container.
            subprocess.run(["tar", "--numeric-owner", "--exclude=./dev/*", "--exclude=./proc/*",
                            "--exclude=./sys/*", "-C", str(root), "-cf", str(partial), "."], check=True)
            partial.rename(path)  # atomic: a reader sees the whole tarball or none
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return path


def base_python_version() -> str:
    """The full version of the base's python3 (3.11.2): dependency markers such as python_full_version <
    "3.11.3" are evaluated against it when the wheelhouse is made."""
    rootfs_tarball()
    return _rootfs()[1].read_text().strip()


def _has(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def base_image(daemon: DockerDaemon) -> str:
    """The Debian base on `daemon`, imported from the cached tarball unless there already; its tag."""
    tag = f"jobpool-test-base:{RELEASE}-{_base_key()}"
    with contextlib.closing(daemon.client(timeout=600)) as client:
        if not _has(client, tag):
            repository, _, version = tag.partition(":")
            client.api.import_image_from_file(
                str(rootfs_tarball()), repository=repository, tag=version,
                changes=["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                         "ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]'],
            )
            client.images.get(tag)  # raises ImageNotFound if the import failed without saying so
    return tag


def _python_like_base(full: str) -> str:
    """A Python on this host of the base's exact version: this one, or Debian's own (/usr/bin/python3: the
    base's when the host runs the same release). pip evaluates dependency markers against the interpreter
    that runs it, never against a target version: redis asks for async-timeout on python_full_version <
    "3.11.3", so wheels resolved by a 3.11.7 lack a package the base's 3.11.2 needs."""
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run([python, "-c", _PRINT_VERSION],
                               capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == full:
            return python
    raise RuntimeError(f"no Python {full} (the base image's) on this host to make its wheels with: "
                       f"{sys.executable} is {platform.python_version()}; /usr/bin/python3 is not it either")


def wheelhouse() -> Path:
    """The cached wheels of jobpool's dependencies and its build backend, resolved by a Python of the base's
    version (`_python_like_base`) with pip (`apt-get install python3-pip` for Debian's). jobpool's own wheel
    is left out: the image builds it from its sources, so the wheelhouse depends on pyproject.toml alone."""
    full = base_python_version()
    python = _python_like_base(full)
    key = _digest((ROOT / "pyproject.toml").read_bytes(), full.encode(), platform.machine().encode())
    path = CACHE_DIR / f"wheels-{key}"
    with _locked(path.name):
        if path.exists():
            return path
        work = Path(tempfile.mkdtemp(prefix="jp-wheels-", dir=CACHE_DIR))
        try:
            # hatchling: pip builds jobpool in the image in an isolated environment, from the wheelhouse too.
            _run([python, "-m", "pip", "--quiet", "--disable-pip-version-check", "wheel", "--wheel-dir",
                  str(work), str(ROOT), "hatchling"])
            for own in work.glob("jobpool-*.whl"):
                own.unlink()
            work.rename(path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return path


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode:
        raise RuntimeError(f"{' '.join(argv[:6])}... failed ({result.returncode}):\n{result.stderr[-3000:]}")


def _context(wheels: Path) -> tuple[bytes, str]:
    """The build context as a tar (this repo's Dockerfile and sources, and the wheelhouse) and its digest."""
    buf = io.BytesIO()
    h = hashlib.sha256()

    def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if "__pycache__" in info.name else info

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in _CONTEXT:
            tar.add(ROOT / name, arcname=name, filter=skip)
            for file in sorted((ROOT / name).rglob("*")) if (ROOT / name).is_dir() else [ROOT / name]:
                if file.is_file() and "__pycache__" not in file.parts:
                    h.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
        tar.add(wheels, arcname="wheelhouse")
        h.update(wheels.name.encode())
    return buf.getvalue(), h.hexdigest()[:12]


def jobpool_image(daemon: DockerDaemon) -> str:
    """jobpool's image on `daemon`, built from this repo's Dockerfile on `base_image` with no network (the
    wheelhouse is in the context): its tag, which names the sources and the base it was built from."""
    base = base_image(daemon)
    context, digest = _context(wheelhouse())
    tag = f"jobpool-test-app:{_digest(digest.encode(), base.encode())[:12]}"
    with contextlib.closing(daemon.client(timeout=900)) as client:
        if not _has(client, tag):
            try:
                client.images.build(fileobj=io.BytesIO(context), custom_context=True, tag=tag,
                                    buildargs={"BASE": base}, network_mode="none", rm=True, forcerm=True)
            except docker.errors.BuildError as exc:
                log = "".join(str(line.get("stream", line.get("error", ""))) for line in exc.build_log)
                raise RuntimeError(f"building {tag} failed: {exc}\n{log[-4000:]}") from exc
    return tag


def load_into(tag: str, source: DockerDaemon, target: DockerDaemon) -> None:
    """Copy image `tag` from `source` to `target` (docker save | docker load, streamed), unless there."""
    with contextlib.closing(target.client(timeout=900)) as dst:
        if _has(dst, tag):
            return
        with contextlib.closing(source.client(timeout=900)) as src:
            dst.api.load_image(src.images.get(tag).save(named=True))
        dst.images.get(tag)


def warm_cache() -> None:
    """Make the cached items that need no daemon (the base's root file system, the wheelhouse): what the
    test session starts in the background (tests/conftest.py) so debootstrap runs beside the other tests."""
    rootfs_tarball()
    wheelhouse()


def cache_is_warm() -> bool:
    """Whether `warm_cache` would find everything made already (no lock taken: a hint, not a promise)."""
    path, version = _rootfs()
    return path.exists() and version.exists() and any(CACHE_DIR.glob("wheels-*"))


if __name__ == "__main__":
    warm_cache()

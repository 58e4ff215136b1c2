"""Build Tether's images (`make images`): a Debian base, the project's wheel, then one image per role.

    python -m infra.images.build [--roles gateway processors ...] [--base IMAGE] [--tag 0.1.0] [--tasks DIR]

With podman (no Docker daemon needed). The base is a Debian bookworm made with
mmdebstrap from the package mirror and imported once (no registry of images
need be reachable); `--base` names another (e.g. docker.io/library/debian:
bookworm-slim). The wheel is built from a copy of the sources, so the
checkout gets no `build/` folder, and each image installs it with its role's
extras, every version from requirements.lock. The build context holds only
the Containerfile, its install script, pyproject.toml, the lock and the
wheel; each image installs its dependencies in a layer of their own, so a
change to the project alone reinstalls only the wheel. The images of a coding
task's pod (swe-tasks, swe-agent) are built the same way, the tasks' image
holding the tasks `tether swe build` wrote (`--tasks`). Prints each image's
size and build time; the sizes also go to bench/results/images.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

from infra.errors import InfraError
from infra.images.roles import BY_NAME, STEP_IMAGES, SWE_TASKS, Role, StepImage
from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = Path(__file__).with_name("Containerfile")
BASE = "localhost/tether-debian:bookworm"
SUITE = "bookworm"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TASKS = ROOT / "examples" / "swe" / "tasks"  # where examples/swe/run.yaml has `tether swe build` write them
MINI_CONFIG = ROOT / "examples" / "mini_swe_agent" / "tether.yaml"
IMAGES: dict[str, Role | StepImage] = {**BY_NAME, **{s.name: s for s in STEP_IMAGES}}


class ImageError(InfraError):
    """The images cannot be built or run here: the message says what is missing or what failed."""


def version() -> str:
    """The project's version: the images' default tag."""
    return importlib.metadata.version("tether")


def podman() -> str:
    found = shutil.which("podman")
    if found is None:
        raise ImageError("podman is not installed (Debian: apt-get install podman runc mmdebstrap uidmap); "
                         "`make images` installs it where it may (root with apt-get)")
    return found


def limits() -> list[str]:
    """--ulimit flags at or below the current limits: where raising them is forbidden, podman's defaults (above
    them) fail every container's start. (In one sandbox, nproc 65536 was refused under a limit of 96367 and
    16384 taken: the bounds below are what worked.)"""
    flags = []
    for name, which, bound in (("nofile", resource.RLIMIT_NOFILE, 65536), ("nproc", resource.RLIMIT_NPROC, 16384)):
        soft, _ = resource.getrlimit(which)
        value = bound if soft == resource.RLIM_INFINITY else min(soft, bound)
        flags += ["--ulimit", f"{name}={value}:{value}"]
    return flags


def run(args: Sequence[str], what: str, timeout_s: float = 3600, quiet: bool = True) -> str:
    """`args`, failing with `what` and the tail of its output."""
    result = subprocess.run(list(args), capture_output=quiet, text=True, timeout=timeout_s)
    if result.returncode != 0:
        tail = ((result.stdout or "") + (result.stderr or ""))[-3000:]
        raise ImageError(f"{what} failed (exit {result.returncode}):\n{tail}")
    return result.stdout or ""


def exists(tool: str, image: str) -> bool:
    return subprocess.run([tool, "image", "exists", image], capture_output=True).returncode == 0


def make_base(tool: str, image: str = BASE) -> float:
    """A Debian base from the package mirror, imported as `image`; seconds taken (0 when it was there)."""
    if exists(tool, image):
        return 0.0
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise ImageError("mmdebstrap is not installed (Debian: apt-get install mmdebstrap), or name a base "
                         "image with --base")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tether-base-") as scratch:
        tarball = Path(scratch) / "base.tar"
        # as Debian's slim images: no manuals, documentation or translations (copyrights kept)
        slim = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("man", "doc", "info", "locale", "lintian")]
        slim += ["--dpkgopt=path-include=/usr/share/doc/*/copyright",
                 "--dpkgopt=path-include=/usr/share/locale/locale.alias"]
        run([mmdebstrap, "--variant=minbase", "--include=ca-certificates", *slim, SUITE, str(tarball)],
            f"mmdebstrap {SUITE}", timeout_s=1800)
        run([tool, "import", "--change", f"ENV {PATH_ENV}", "--change", 'CMD ["/bin/bash"]', str(tarball), image],
            "podman import")
    return time.perf_counter() - started


def build_wheel(out: Path) -> Path:
    """The project's wheel, built from a copy of the sources (a build writes `build/` beside them)."""
    packages = [name.rstrip("*") for name in
                tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
                ["include"]]
    with tempfile.TemporaryDirectory(prefix="tether-wheel-") as scratch:
        source = Path(scratch)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, source / name)
        for package in packages:
            shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
        out.mkdir(parents=True, exist_ok=True)
        # the same sources give the same bytes (every entry dated alike), so an unchanged project reuses the
        # images' cached install layers
        env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}
        result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                                 "--wheel-dir", str(out), str(source)], capture_output=True, text=True, timeout=600,
                                env=env)
        if result.returncode != 0:
            raise ImageError(f"building the wheel failed:\n{(result.stdout + result.stderr)[-3000:]}")
    (wheel,) = out.glob("tether-*.whl")
    return wheel


def context(into: Path, images: Sequence[Role | StepImage], tasks: Path = TASKS) -> Path:
    """The build context: the Containerfile, its install script, pyproject.toml, the lock and the wheel, nothing
    else of the checkout; for the broker, its jars as the launcher fetches them (Maven, once); for the coding
    task's images, the tasks (`tasks`) and mini-swe-agent's settings."""
    names = {image.name for image in images}
    if SWE_TASKS.name in names and not (tasks / "tasks.jsonl").is_file():
        raise ImageError(f"{tasks}: no tasks.jsonl, for the image {SWE_TASKS.image}; build the tasks first: "
                         f"tether swe build --package toolz==1.2.0 --out {tasks}")
    shutil.copy(CONTAINERFILE, into / "Containerfile")
    shutil.copy(CONTAINERFILE.with_name("install.sh"), into / "install.sh")
    shutil.copy(ROOT / "requirements.lock", into / "requirements.lock")
    shutil.copy(ROOT / "pyproject.toml", into / "pyproject.toml")
    build_wheel(into / "dist")
    if "kafka" in names:
        shutil.copytree(KafkaBroker(BrokerSettings()).fetch(), into / "kafka-libs")
    # (a builder that builds every stage before its target, as Docker's legacy one does, copies the tasks for
    # any target after theirs: an empty folder where they are not wanted)
    if SWE_TASKS.name in names:
        shutil.copytree(tasks, into / "tasks", ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    else:
        (into / "tasks").mkdir()
    shutil.copy(MINI_CONFIG, into / "mini.yaml")
    return into


def build_role(tool: str, role: Role | StepImage, ctx: Path, base: str, tag: str, quiet: bool = True) -> float:
    """The role's image as tether-<role>:<tag>; seconds taken. The host's uv cache, where there is one, serves
    the wheels (a cold build downloads them)."""
    cache = Path(os.environ.get("UV_CACHE_DIR", Path.home() / ".cache" / "uv"))
    volume = ["--volume", f"{cache}:/var/cache/uv"] if cache.is_dir() else []
    bundle = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))
    if bundle.is_file():  # the host's CAs (a proxy that inspects TLS may be among them), for the installs only
        volume += ["--volume", f"{bundle.resolve()}:/run/host-ca.crt:ro", "--build-arg", "CA_BUNDLE=/run/host-ca.crt"]
    started = time.perf_counter()
    run([tool, "build", "--format", "docker", "--network", "host", *limits(), *volume,
         "--build-arg", f"BASE={base}", "--build-arg", f"KAFKA_VERSION={BrokerSettings().version}",
         "--target", role.name, "--tag", f"{role.image}:{tag}",
         "--file", str(ctx / "Containerfile"), str(ctx)], f"building {role.image}", quiet=quiet)
    return time.perf_counter() - started


def size_mb(tool: str, image: str) -> float:
    return int(run([tool, "image", "inspect", "--format", "{{.Size}}", image], "podman image inspect")) / 1e6


def build(roles: Sequence[Role | StepImage], base: str | None = None, tag: str | None = None, quiet: bool = True,
          tasks: Path = TASKS) -> dict[str, dict[str, float]]:
    """Every image of `roles` (the base first, made where none is named); per image its size and build time."""
    tool, tag = podman(), tag or version()
    figures: dict[str, dict[str, float]] = {}
    if base is None:
        base = BASE
        figures["base"] = {"build_s": make_base(tool), "size_mb": size_mb(tool, BASE)}
    with tempfile.TemporaryDirectory(prefix="tether-images-") as scratch:
        ctx = context(Path(scratch), roles, tasks)
        for role in roles:
            seconds = build_role(tool, role, ctx, base, tag, quiet)
            figures[role.image] = {"build_s": seconds, "size_mb": size_mb(tool, f"{role.image}:{tag}")}
            print(f"{role.image}:{tag}: {figures[role.image]['size_mb']:,.0f} MB, built in {seconds:.0f} s",
                  flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roles", nargs="+", choices=list(IMAGES), default=list(IMAGES))
    parser.add_argument("--base", help=f"a Debian bookworm image to build on (default: {BASE}, made here)")
    parser.add_argument("--tag", help="the images' tag (default: the project's version)")
    parser.add_argument("--tasks", type=Path, default=TASKS, help="the tasks the swe-tasks image holds "
                        f"(default: {TASKS.relative_to(ROOT)}, where examples/swe/run.yaml reads them)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "images.json")
    args = parser.parse_args()
    try:
        figures = build([IMAGES[r] for r in args.roles], args.base, args.tag, tasks=args.tasks)
    except ImageError as exc:
        sys.exit(f"make images: {exc}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1))
    print(f"{'image':<20} {'size MB':>10} {'build s':>8}")
    for name, f in figures.items():
        print(f"{name:<20} {f['size_mb']:>10,.0f} {f['build_s']:>8.0f}")


if __name__ == "__main__":
    main()

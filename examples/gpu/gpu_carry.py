"""Wheels for a machine without network: which to carry (``prepare``, on a machine that reaches
the package index) and which of them to install (``install``, on the GPU machine).

Standard library and ``packaging`` only (pip's own copy where the package is absent): this
runs on the GPU machine before anything is installed there.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import Callable, Iterable, Optional

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.tags import sys_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import Version
except ImportError:  # pragma: no cover - a Python with pip but without packaging
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
    from pip._vendor.packaging.version import Version

PLUGIN = "pytest-ftready"
LIMIT_BYTES = 64 * 1024 * 1024  # what may travel to the GPU machine in one call, working tree included
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Image:
    """What the GPU machine already has (``gpu-image.toml``)."""

    python: str
    platforms: tuple[str, ...]
    packages: dict  # canonical name -> version ("" where not read)
    fallbacks: dict  # canonical name -> why its wheel is carried although the machine has the package

    @classmethod
    def load(cls, path: Path) -> "Image":
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        return cls(python=data["python"], platforms=tuple(data["platforms"]),
                   packages={canonicalize_name(k): v for k, v in data["packages"].items()},
                   fallbacks={canonicalize_name(k): v for k, v in data.get("fallbacks", {}).items()})

    def marker_environment(self) -> dict:
        """PEP 508 marker values of the GPU machine (CPython on x86-64 Linux)."""
        return {"python_version": self.python, "python_full_version": f"{self.python}.0", "os_name": "posix",
                "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                "platform_release": "", "platform_version": "", "implementation_name": "cpython",
                "implementation_version": f"{self.python}.0", "platform_python_implementation": "CPython"}


def wheel_metadata(path: Path) -> tuple[str, str, list[str]]:
    """(canonical name, version, Requires-Dist lines) of a wheel file."""
    name, version, _, _ = parse_wheel_filename(Path(path).name)
    with zipfile.ZipFile(path) as archive:
        meta = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        headers = HeaderParser().parsestr(archive.read(meta).decode("utf-8"))
    return canonicalize_name(name), str(version), headers.get_all("Requires-Dist") or []


def applicable(lines: Iterable[str], extras: Iterable[str] = (), environment: Optional[dict] = None) -> list:
    """The requirements among ``lines`` that apply with ``extras`` (markers evaluated for
    ``environment``, default this interpreter)."""
    out = []
    for line in lines:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**(environment or {}), "extra": extra})
                                     for extra in ("", *extras)):
            out.append(req)
    return out


def installed_version(name: str) -> Optional[str]:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def satisfies(version: Optional[str], specifier: SpecifierSet) -> bool:
    return version is not None and specifier.contains(Version(version), prereleases=True)


# ---- prepare: here, with the package index -------------------------------------------------------
def travelling_files(repo: Path) -> list[Path]:
    """The files of ``repo`` that travel to the GPU machine: tracked, and untracked but not ignored."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    return [repo / name for name in listed if name and (repo / name).is_file()]


def build_plugin_wheel(repo: Path, into: Path, pip: list[str]) -> Path:
    """The plugin's wheel, built from a copy of the travelling files (no stale ``build/`` folder,
    exactly the code that runs there)."""
    with tempfile.TemporaryDirectory(prefix="ftready-wheel-") as tmp:
        source = Path(tmp) / "src"
        for path in travelling_files(repo):
            target = source / path.relative_to(repo)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        before = set(into.glob("*.whl"))
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "--wheel-dir", str(into), str(source)], check=True)
    (wheel,) = set(into.glob("*.whl")) - before
    return wheel


@dataclass
class Carry:
    """What ``prepare`` decided: each carried wheel with why, and what the machine has already."""

    wheels: dict = field(default_factory=dict)  # name -> {"file", "version", "bytes", "why": [...]}
    present: dict = field(default_factory=dict)  # name -> why it is not carried

    def bytes(self) -> int:
        return sum(w["bytes"] for w in self.wheels.values())


def prepare(repo: Path, carry_dir: Path, image: Image, *, extras: tuple = ("trl",), also: tuple = (),
            fallbacks: bool = True, pip: Optional[list] = None, log: Callable = print) -> Carry:
    """Build the plugin's wheel and download, for ``image``'s Python and platform, every package its
    requirements (with ``extras``) need that the image lacks or has too old, recursively."""
    pip = pip or [sys.executable, "-m", "pip"]
    wheels = carry_dir / "wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    wheels.mkdir(parents=True)
    plugin = build_plugin_wheel(repo, wheels, pip)
    name, version, lines = wheel_metadata(plugin)
    carry = Carry()
    carry.wheels[name] = {"file": plugin.name, "version": version, "bytes": plugin.stat().st_size,
                          "why": ["the plugin, built from this checkout"]}
    environment = image.marker_environment()
    queue = [(req, PLUGIN) for req in applicable(lines, extras, environment)]
    queue += [(Requirement(spec), "--also") for spec in also]
    needs: dict = {}
    while queue:
        req, by = queue.pop(0)
        dist = canonicalize_name(req.name)
        if dist == name:
            continue
        known = image.packages.get(dist)
        if known is not None and dist not in image.fallbacks and by != "--also":
            if not known or satisfies(known, req.specifier):
                carry.present.setdefault(dist, f"on the machine{f' ({known})' if known else ''}")
                continue
        needs[dist] = needs.get(dist, SpecifierSet()) & req.specifier
        entry = carry.wheels.get(dist)
        if entry:
            entry["why"].append(f"{by} needs {req}")
            if satisfies(entry["version"], needs[dist]):
                continue
            (wheels / entry["file"]).unlink()  # a later requirement wants another version
        path = _download(dist, needs[dist], wheels, image, pip, log)
        _, got, requires = wheel_metadata(path)
        why = [f"{by} needs {req}"] + (entry["why"] if entry else [])
        if dist in image.fallbacks:
            why.append(f"fallback: {image.fallbacks[dist]}")
        carry.wheels[dist] = {"file": path.name, "version": got, "bytes": path.stat().st_size, "why": why}
        carry.present.pop(dist, None)
        queue += [(r, dist) for r in applicable(requires, (), environment)]
    if not fallbacks:
        for dist in [d for d in carry.wheels if d in image.fallbacks]:
            log(f"prepare: leaving out the fallback {carry.wheels[dist]['file']} (--no-fallbacks)")
            (wheels / carry.wheels.pop(dist)["file"]).unlink()
    (carry_dir / MANIFEST).write_text(json.dumps({
        "python": image.python, "platforms": list(image.platforms), "extras": list(extras),
        "fallbacks": sorted(d for d in carry.wheels if d in image.fallbacks),
        "wheels": carry.wheels, "present": carry.present}, indent=2) + "\n")
    return carry


def _download(dist: str, specifier: SpecifierSet, into: Path, image: Image, pip: list, log: Callable) -> Path:
    """One wheel for the image's Python and platform: the version installed here where it fits
    (the one this checkout's tests ran with), else the newest that does."""
    here = installed_version(dist)
    spec = f"{dist}=={here}" if satisfies(here, specifier) else f"{dist}{specifier}"
    platforms = [arg for p in image.platforms for arg in ("--platform", p)]
    before = set(into.iterdir())
    log(f"prepare: downloading {spec}")
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", image.python,
                    "--implementation", "cp", *platforms, "-d", str(into), spec], check=True)
    (path,) = set(into.iterdir()) - before
    return path


def size_report(carry_dir: Path, repo: Path, limit: int = LIMIT_BYTES) -> tuple[bool, list[str]]:
    """(fits, lines): the carried wheels and the working tree beside them against ``limit``."""
    manifest = json.loads((carry_dir / MANIFEST).read_text())
    wheels = sorted(manifest["wheels"].values(), key=lambda w: -w["bytes"])
    carried = sum((carry_dir / "wheels" / w["file"]).stat().st_size for w in wheels)
    tree = sum(p.stat().st_size for p in travelling_files(repo))
    total = carried + tree
    mib = lambda n: f"{n / 1048576:.1f} MiB"  # noqa: E731
    lines = [f"  {w['file']}: {mib(w['bytes'])}" for w in wheels]
    lines.append(f"carried wheels {mib(carried)} + the working tree that travels beside them {mib(tree)} = "
                 f"{mib(total)} of {mib(limit)}")
    fits = total <= limit
    if not fits:
        lines.append(f"over by {mib(total - limit)}: copy the largest wheels to the machine another way "
                     f"(into {carry_dir / 'wheels'} there), or prepare --no-fallbacks")
    return fits, lines


# ---- install: there, without network ----------------------------------------------------------------
@dataclass
class Plan:
    install: list = field(default_factory=list)  # wheel paths
    present: dict = field(default_factory=dict)  # name -> the machine's version, which fits
    problems: list = field(default_factory=list)  # one line each

    def names(self) -> list[str]:
        """'name version' of each wheel to install."""
        return [" ".join(wheel_metadata(p)[:2]) for p in self.install]

    def dists(self) -> list[str]:
        return [wheel_metadata(p)[0] for p in self.install]


def plan_install(carry_dir: Path, version_of: Callable = installed_version) -> Plan:
    """Which carried wheels this machine needs: the plugin's always (it is what runs); any other
    when a wheel going in needs it and the machine lacks it or has a version that does not fit."""
    plan = Plan()
    if not (carry_dir / MANIFEST).is_file():
        plan.problems.append(f"no carry in {carry_dir} (no {MANIFEST}): run ftready_gpu.py prepare first")
        return plan
    manifest = json.loads((carry_dir / MANIFEST).read_text())
    carried = {}
    for path in sorted((carry_dir / "wheels").glob("*.whl")):
        name, version, lines = wheel_metadata(path)
        carried[name] = (version, path, lines)
    if PLUGIN not in carried:
        plan.problems.append(f"no {PLUGIN} wheel in {carry_dir / 'wheels'}: run ftready_gpu.py prepare first")
        return plan
    tags = set(sys_tags())
    chosen, queue = set(), [PLUGIN]
    while queue:
        name = queue.pop(0)
        if name in chosen:
            continue
        chosen.add(name)
        version, path, lines = carried[name]
        if not set(parse_wheel_filename(path.name)[3]) & tags:
            plan.problems.append(f"{path.name} does not install on this Python {sys.version.split()[0]}: "
                                 f"prepare the carry for it (prepare --python-version)")
            continue
        plan.install.append(path)
        extras = manifest.get("extras", []) if name == PLUGIN else []
        for req in applicable(lines, extras):
            dist = canonicalize_name(req.name)
            have = version_of(dist)
            if dist in carried and dist not in chosen and not satisfies(have, req.specifier):
                queue.append(dist)
            elif have is not None and dist not in carried:
                plan.present[dist] = have
    for name in carried:
        if name not in chosen and version_of(name):
            plan.present[name] = version_of(name)
    return plan


def install(plan: Plan, site: Path, log: Callable = print) -> None:
    """``pip install --no-index --no-deps --target site`` of the planned wheels (nothing is fetched)."""
    if not plan.install:
        return
    site.mkdir(parents=True, exist_ok=True)
    log(f"install: {', '.join(plan.names())} into {site}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, plan.install)], check=True)


def unmet(names: Iterable[str], extras: Iterable[str] = ()) -> list[str]:
    """For each installed distribution in ``names``: its requirements that the environment (as
    ``sys.path`` now finds it) does not meet, one line each with what to carry."""
    problems = []
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            problems.append(f"{name} is not installed")
            continue
        for req in applicable(dist.requires or [], extras if canonicalize_name(name) == PLUGIN else ()):
            have = installed_version(req.name)
            if have is None or not satisfies(have, req.specifier):
                found = f"this machine has {have}" if have else "this machine lacks it"
                problems.append(f"{name} {dist.version} needs {req}; {found}: carry it "
                                f"(ftready_gpu.py prepare --also '{req.name}{req.specifier}')")
    return problems

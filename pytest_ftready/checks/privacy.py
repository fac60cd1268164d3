"""Privacy checks: license and data rights, effective file access, secrets and personal
data in training data and artifacts, backups and retention. No output ever carries a
finding's value: only its kind, place, fingerprint and a redacted preview."""

from __future__ import annotations

import time
from pathlib import Path

from ..privacy.audit import exposure, looks_encrypted, model_license, walk
from ..outcomes import Fail, Skip
from .registry import STAGES, check

MAX_LISTED = 20


@check("privacy.license", stage=STAGES["privacy"])
def license_(ctx) -> None:
    """The model's license is one the recipe accepts; the dataset's rights are declared."""
    recipe = ctx.recipe
    found, where = model_license(recipe)
    ctx.measure("model_license", found or "unknown", "")
    problems = []
    accepted = [lic.lower() for lic in recipe.privacy.licenses]
    if found is None:
        problems.append(f"the model's license is unknown ({where}): read its terms, then write [model] license")
    elif not accepted:
        problems.append(f"the model is licensed {found!r} ({where}) but the recipe accepts no license: review the "
                        f"terms and write [privacy] licenses = [\"{found}\"]")
    elif found not in accepted:
        problems.append(f"the model is licensed {found!r} ({where}), not one of [privacy] licenses "
                        f"{list(recipe.privacy.licenses)}")
    if not recipe.data.rights.strip():
        problems.append("the dataset's rights are not declared: write [data] rights = \"why we may train "
                        "on this data\"")
    if problems:
        raise Fail("\n".join(problems))


def private_paths(state) -> list[Path]:
    recipe = state.recipe
    paths = [*recipe.data.train, state.artifacts, recipe.training.output_dir, *recipe.privacy.scan_paths]
    if recipe.data.manifest:
        paths.append(recipe.data.manifest)
    if recipe.model.path:
        paths.append(recipe.model.path)
    else:
        from ..machine.hub import repo_cache_dir

        paths.append(repo_cache_dir(recipe.model.id))
    return [Path(p) for p in paths]


@check("privacy.permissions", stage=STAGES["privacy"] + 1)
def permissions(ctx) -> None:
    """Data, caches, logs, checkpoints and adapters are not reachable by group or others."""
    checked, exposed = 0, []
    paths = walk(private_paths(ctx.state))
    for path in paths:
        checked += 1
        found = exposure(path)
        if found:
            exposed.append(found)
    ctx.measure("paths_checked", checked, "paths")
    ctx.measure("paths_exposed", len(exposed), "paths")
    problems = []
    if exposed:
        shown = "\n  ".join(e.describe() for e in exposed[:MAX_LISTED])
        more = f"\n  and {len(exposed) - MAX_LISTED} more" if len(exposed) > MAX_LISTED else ""
        problems.append(f"{len(exposed)} path(s) readable or writable beyond their owner:\n  {shown}{more}")
    if paths.unreadable:
        ctx.measure("folders_unreadable", len(paths.unreadable), "folders")
        problems.append(f"{len(paths.unreadable)} folder(s) could not be listed, so what is inside was not checked: "
                        + ", ".join(paths.unreadable[:5]) + "; make them readable by the user running the checks")
    if problems:
        raise Fail("\n".join(problems))
    if not checked:
        raise Skip("none of the data, model, artifact or output paths exists yet: nothing to check ("
                   + ", ".join(str(p) for p in paths.missing[:5]) + ")")


def _scan_check(ctx, category: str) -> None:
    recipe = ctx.recipe
    if category not in recipe.privacy.scan:
        raise Skip(f"[privacy] scan does not include {category!r}")
    scan = ctx.state.scan
    allow, scanned, seconds = scan.allowlisted, scan.bytes_scanned, scan.seconds
    files = scan.files
    mine = [f for f in scan.findings if f.finding.category == category]
    accepted = [f for f in mine if f.finding.fingerprint in allow]
    report = [f for f in mine if f.finding.fingerprint not in allow]
    ctx.measure("files_scanned", files, "files")
    ctx.measure("bytes_scanned", scanned, "bytes")
    ctx.measure("binary_files_scanned", scan.binary_files, "files")
    ctx.measure("paths_not_scanned", len(scan.not_scanned), "paths")
    ctx.measure("scan_mb_per_s", scanned / 1e6 / seconds if seconds else 0.0, "MB/s")
    ctx.measure(f"{category}_findings", len(report), "findings")
    ctx.measure(f"{category}_allowlisted", len(accepted), "findings")
    if report:
        kinds = sorted({f.finding.kind for f in report})
        shown = "\n  ".join(f.describe() for f in report[:MAX_LISTED])
        more = f"\n  and {len(report) - MAX_LISTED} more" if len(report) > MAX_LISTED else ""
        allow_hint = (f"; accept known ones by adding their fingerprints to {recipe.privacy.allowlist}"
                      if recipe.privacy.allowlist else "; accept known ones by fingerprint in [privacy] allowlist")
        raise Fail(f"{len(report)} {'secret' if category == 'secrets' else 'personal data'} finding(s) "
                   f"({', '.join(kinds)}):\n  {shown}{more}\nRemove or redact them before training{allow_hint}")
    missed = "\n  ".join(scan.not_scanned[:MAX_LISTED])
    if not files:
        raise Skip(f"nothing was scanned for {category}: no file under the training data or [privacy] scan_paths"
                   + (f":\n  {missed}" if missed else ""))
    if scan.not_scanned:
        raise Fail(f"{len(scan.not_scanned)} training data or [privacy] scan_paths entr(ies) could not be scanned:\n  "
                   f"{missed}\nCorrect the path in the recipe, or remove it from scan_paths")


@check("privacy.secrets", stage=STAGES["privacy"] + 2)
def secrets(ctx) -> None:
    """No keys, tokens or passwords in the training data or the scanned artifacts."""
    _scan_check(ctx, "secrets")


@check("privacy.pii", stage=STAGES["privacy"] + 3)
def pii(ctx) -> None:
    """No e-mail addresses, phone numbers, cards, IBANs, IP addresses or national ids."""
    _scan_check(ctx, "pii")


@check("privacy.retention", stage=STAGES["privacy"] + 4)
def retention(ctx) -> None:
    """Backups are declared encrypted (and are); a retention period is declared; nothing outlives it."""
    recipe, state = ctx.recipe, ctx.state
    privacy = recipe.privacy
    problems, unseen = [], ""
    backups = privacy.backups
    if not backups:
        problems.append("no backup policy: write [privacy] backups = { path = \"backups/\", encrypted = true }")
    elif not backups["encrypted"]:
        problems.append(f"backups at {backups['path']} are declared unencrypted: encrypt them (age, gpg) and "
                        "write encrypted = true")
    else:
        folder = (recipe.folder / backups["path"]).resolve()
        backup_files = [p for p in walk([folder]) if p.is_file()]
        plain = [p for p in backup_files if not looks_encrypted(p)]
        ctx.measure("backup_files_checked", len(backup_files), "files")
        ctx.measure("backup_files_plain", len(plain), "files")
        if plain:
            problems.append(f"{len(plain)} backup file(s) in {folder} are not encrypted, e.g. "
                            + ", ".join(str(p) for p in plain[:5]))
        if not folder.exists():
            unseen = (f"the backups folder {folder} ([privacy] backups path = \"{backups['path']}\") does "
                      f"not exist, so "
                      "no backup was checked: point path at where the backups are written")
    if not privacy.retention_days:
        problems.append("no retention period: write [privacy] retention_days = 90 (or what your policy says)")
    else:
        cutoff = time.time() - privacy.retention_days * 86400
        roots = [recipe.training.output_dir, state.artifacts, *privacy.scan_paths]
        artifacts = [p for p in walk(roots) if p.is_file()]
        old = [p for p in artifacts if p.stat().st_mtime < cutoff]
        ctx.measure("artifact_files_checked", len(artifacts), "files")
        ctx.measure("files_past_retention", len(old), "files")
        if old:
            problems.append(f"{len(old)} artifact(s) are older than retention_days = {privacy.retention_days}: delete "
                            "or archive them, e.g. " + ", ".join(str(p) for p in old[:5]))
    if problems:
        raise Fail("\n".join(problems))
    if unseen:
        raise Skip(unseen)

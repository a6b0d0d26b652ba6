"""Build a release from an env folder: read its `corral.toml`, load the env, describe it, pack it.

An env folder holds the env's code, its tasks, its Dockerfile and assets, and a `corral.toml`
with `[[env]]` entries (`id`, `entry_point`, optional `kind`, `tags`, `description`, `version`,
`license`). The entry point may name the folder's module relatively (`env:MyEnv`) or by its
import name when the folder is part of an installed package (`corral.envs.text.arithmetic:...`);
the release stores it relative to the folder, so installing it anywhere works. Code in the
folder imports its own modules relatively and everything else absolutely; a relative import
that climbs out of the folder is refused at publish time, since the release would not carry it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from corral import __version__ as corral_version
from corral import envs as builtin_envs
from corral.tools import collect

from corral.catalog import EnvSpec
from .errors import ReleaseError
from .imports import serve_folder
from .release import (DEFAULT_LIMITS, DatasetCard, Limits, ReleaseManifest, SemVer,
                      archive_digest, collect_files, content_digest, file_entries, pack)

__all__ = ["BuiltRelease", "FAMILY_FIELDS", "MANIFEST", "ReportMismatch", "build_dataset_card",
           "build_release", "check_relative_imports", "folder_relative", "image_recipe_hash",
           "load_class", "pick_entry", "read_entries", "register_folder", "relative_entry_point",
           "run_validation", "validation_card"]

log = logging.getLogger(__name__)

MANIFEST = "corral.toml"
FAMILY_FIELDS = ("family", "category", "template")


@dataclass
class BuiltRelease:
    """A packed release: its manifest, the archive on disk and the archive's sha256."""

    manifest: ReleaseManifest
    archive: Path
    sha256: str


def read_entries(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The folder's `corral.toml`: top-level keys and its `[[env]]` entries."""
    path = folder / MANIFEST
    if not path.is_file():
        raise ReleaseError(f"{folder} has no {MANIFEST}; an env folder lists its envs there "
                           "([[env]] id = ..., entry_point = 'module:Class')")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ReleaseError(f"{path}: invalid TOML ({exc})") from None
    entries = data.get("env", [])
    if not entries:
        raise ReleaseError(f"{path} lists no [[env]] entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ReleaseError(f"{path}: `env` must be [[env]] tables, got {entries!r:.80}")
    top = {k: v for k, v in data.items() if k != "env"}
    _check_types(path, "the top level", top, _TOP_FIELDS)
    for number, entry in enumerate(entries, 1):
        for required in ("id", "entry_point"):
            if required not in entry:
                raise ReleaseError(f"{path}: [[env]] {number} has no {required}")
        _check_types(path, f"[[env]] {entry['id']!r:.60}", entry, _ENTRY_FIELDS)
    return top, entries


# What each field of corral.toml must be (a string `tags = "x"` was published as letters)
_TEXT = (str, "a string")
_ENTRY_FIELDS: dict[str, tuple[type, str]] = {
    "id": _TEXT, "entry_point": _TEXT, "kind": _TEXT, "description": _TEXT, "version": _TEXT,
    "license": _TEXT, "tags": (list, "a list of strings"),
    **{name: _TEXT for name in FAMILY_FIELDS}}
_TOP_FIELDS = {"version": _TEXT, "license": _TEXT}


def _check_types(path: Path, where: str, table: dict[str, Any],
                 fields: dict[str, tuple[type, str]]) -> None:
    """A ReleaseError naming the file, the table and the field whose value has the wrong type."""
    for name, (kind, wanted) in fields.items():
        value = table.get(name)
        if value is None:
            continue
        ok = isinstance(value, kind) and (kind is not list
                                          or all(isinstance(v, str) for v in value))
        if not ok:
            raise ReleaseError(f"{path}: {where}: {name} must be {wanted}, got {value!r:.60}")


def pick_entry(folder: Path, entries: list[dict[str, Any]], env_id: str | None) -> dict[str, Any]:
    ids = [e.get("id") for e in entries]
    if env_id is None:
        if len(entries) > 1:
            raise ReleaseError(f"{folder / MANIFEST} lists {len(entries)} envs ({', '.join(ids)});"
                               " choose one with --id")
        return entries[0]
    for entry in entries:
        if entry.get("id") == env_id:
            return entry
    from corral.suggest import closest

    raise ReleaseError(f"{folder / MANIFEST} has no env {env_id!r}.{closest(env_id, ids)}")


def relative_entry_point(folder: Path, entry_point: str) -> str:
    """`module:Class` with the module relative to `folder` (which must contain it); `:Class`
    when the class lives in the folder's own `__init__.py`."""
    module, _, attr = entry_point.partition(":")
    if not attr:
        raise ReleaseError(f"entry point {entry_point!r} must look like 'module:Class'")
    rel_file = folder / Path(*module.split("."))
    if rel_file.with_suffix(".py").is_file() or (rel_file / "__init__.py").is_file():
        return entry_point
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None or not origin.is_relative_to(folder):
        raise ReleaseError(f"entry point {entry_point!r}: module {module} is not inside {folder}")
    parts = list(origin.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return f"{'.'.join(parts)}:{attr}"  # ':Class' names the folder's own __init__.py


def check_relative_imports(folder: Path, files: dict[str, Path]) -> None:
    """Refuse `from ..x import y` that reaches above the folder: the release would lack `x`."""
    for rel, path in files.items():
        if not rel.endswith(".py"):
            continue
        try:
            tree = ast.parse(path.read_bytes(), filename=rel)
        except SyntaxError as exc:
            raise ReleaseError(f"{rel}:{exc.lineno}: syntax error ({exc.msg})") from None
        depth = rel.count("/")  # `from .` is the folder itself for a top-level module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > depth + 1:
                dots = "." * node.level
                raise ReleaseError(
                    f"{rel}:{node.lineno}: 'from {dots}{node.module or ''} import ...' reaches "
                    f"outside the env folder, which the release does not carry; import it "
                    "absolutely (e.g. from corral.envs... import ...) or copy it into the folder")


def load_class(folder: Path, rel_entry_point: str, original: str) -> Any:
    """Import the env class: by its own import name when the folder is importable as such, else
    through a private package name for the folder. A private import's registration in the
    default catalog is undone: publishing a folder does not add it to this process's catalog
    (an install of the same env, later in this process, registers the release's copy)."""
    if original != rel_entry_point:
        return EnvSpec("x/load-v0", original).load()
    from corral.catalog import default_catalog

    name = serve_folder(folder)
    module, _, attr = rel_entry_point.partition(":")
    with default_catalog.unlisted():  # an installed release of this id is no clash
        cls = EnvSpec("x/load-v0", f"{name}.{module}:{attr}" if module else f"{name}:{attr}").load()
    env_id = getattr(cls, "env_id", None)
    if env_id and env_id in default_catalog and default_catalog.spec(env_id).entry_point is cls:
        default_catalog.unregister(env_id)
    return cls


def _check_dockerfile(env_id: str, cls: Any) -> None:
    """A ReleaseError when the env's `Terminal(dockerfile=...)` names no file: published, the
    release would fail only later, at its first build in `run` or `validate`."""
    spec = getattr(cls, "sandbox_spec", None)
    if spec is None or not getattr(spec, "dockerfile", None):
        return
    from corral.terminal import resolve_dockerfile

    path = Path(resolve_dockerfile(cls, spec).dockerfile or "")
    if not path.is_file():
        raise ReleaseError(f"{env_id}: dockerfile {spec.dockerfile!r} is not a file ({path})")


def image_recipe_hash(sandbox: dict[str, Any] | None, files: dict[str, Path],
                      entries: dict[str, Any]) -> str:
    """sha256 over the sandbox spec and every Dockerfile in the folder (what builds the image)."""
    recipes = {rel: entries[rel].sha256 for rel in files
               if Path(rel).name == "Dockerfile" or Path(rel).name.endswith(".Dockerfile")}
    blob = json.dumps({"sandbox": sandbox, "dockerfiles": recipes}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def build_dataset_card(cls: Any, folder: Path, license: str,
                       provenance: dict[str, str]) -> tuple[DatasetCard, str]:
    """The card of the env's dataset packed in a release (`DatasetCard`) and the dataset's
    hash (equal to `Dataset.fingerprint()`), computed in one pass: a procedural dataset builds
    every task on access, so the pass is the cost.

    Splits are the dataset's declared ones (`corral.splits`): "train" and "eval", the name
    `corral eval` reads; a dataset that declares no eval split has "train" only. Fields are every
    field of every task with the types of its values ("int", "str | null"; "missing" where
    some task lacks it)."""
    from corral.splits import describe, rule_of

    tasks = cls.tasks
    size = len(tasks)
    first = tasks[0] if size else None
    # The family field is read off the first task (task types are uniform): one lookup per task.
    family_field = next((f for f in FAMILY_FIELDS if first is not None
                         and f in first.fields()), None)
    rule = rule_of(tasks)
    fingerprint = hashlib.sha256()
    held_out = 0
    families: dict[str, int] = {}
    types: dict[str, set[str]] = {}
    for index, task in enumerate(tasks):
        fingerprint.update(task.id.encode() + b"\n")
        held_out += rule is not None and rule.is_eval(task)
        if family_field is not None:
            family = str(getattr(task, family_field, None))
            families[family] = families.get(family, 0) + 1
        values = task.fields()
        for name in types.keys() - values.keys():
            types[name].add("missing")
        for name, value in values.items():
            types.setdefault(name, {"missing"} if index else set()).add(_type_name(value))
    if family_field is None:
        families = {folder.name: size}
    splits = {"train": size - held_out}
    if rule is not None:  # an explicit eval dataset holds its own tasks
        splits["eval"] = len(rule.tasks) if hasattr(rule, "ids") else held_out
    card = DatasetCard(tasks=size, splits=splits,
                       split_rule=describe(tasks).replace(f"{folder}/", ""),
                       families=dict(sorted(families.items())), task_type=tasks.task_type.__name__,
                       fields={name: " | ".join(sorted(kinds)) for name, kinds in
                               sorted(types.items())},
                       source=folder_relative(tasks.source, folder),
                       example=_example(cls, first), provenance=provenance, license=license)
    return card, fingerprint.hexdigest()


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def folder_relative(source: str, folder: Path) -> str:
    """`source` (a dataset's, often an absolute path on the publisher's machine) relative to
    the env folder when it lies inside; an absolute path elsewhere keeps only its file name
    (the release must not carry the publisher's paths)."""
    path = Path(source)
    if not path.is_absolute():
        return source
    if path.is_relative_to(folder):
        return path.relative_to(folder).as_posix()
    return path.name


def _example(cls: Any, task: Any) -> str:
    if task is None:
        return ""
    try:
        return str(cls().instruction(task))[:2000]
    except Exception as exc:  # an example is a nicety; the card is still right without it
        log.debug("no example instruction for %s: %s", cls, exc)
        return ""


def _git_commit(folder: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _default_license(folder: Path) -> str:
    builtin_root = Path(builtin_envs.__file__).parent.resolve()
    if folder == builtin_root or builtin_root in folder.parents:
        try:  # the built-in envs carry Corral's own licence
            return importlib.metadata.metadata("corral").get("License") or "unspecified"
        except importlib.metadata.PackageNotFoundError:
            return "unspecified"
    return "unspecified"


class ReportMismatch(ReleaseError):
    """A validation report given to `build_release` is of another env than the one packed."""


def _validation_dict(validation: Any) -> dict[str, Any] | None:
    if validation is None:
        return None
    if hasattr(validation, "model_dump"):
        return validation.model_dump(mode="json")
    if isinstance(validation, dict):
        return validation
    raise ReleaseError(f"validation must be a ValidationReport or a dict, not "
                       f"{type(validation).__name__}")


def run_validation(cls: Any, limit: int, adversarial: bool = False,
                   env_id: str | None = None) -> Any:
    """Validate the env class (oracle must pass, no-op must fail, with `adversarial` no hack
    may beat the no-op) on its first `limit` tasks; `env_id`: its manifest's id (a class listed
    in a manifest need not name its id in code), which its instances then carry."""
    from corral.sync import run_sync
    from corral.registry.validate import validate

    env = EnvSpec(env_id, cls).make if env_id is not None else cls
    return run_sync(validate(env, limit=limit, adversarial=adversarial))


def register_folder(folder: Path, package: str) -> list[str]:
    """Add the `[[env]]` entries of an env folder's `corral.toml` to the default catalog, the
    folder's own modules imported as `package` (`serve_folder`): `corral -i FOLDER/env.py` lists
    the folder's envs with the ids, tags and descriptions its manifest gives them. Entry points
    outside the folder (an installed package's import name) are kept as written. Returns the
    ids."""
    from corral.catalog import default_catalog

    _, entries = read_entries(folder)
    for entry in entries:
        module, _, attr = entry["entry_point"].partition(":")
        local = (folder / Path(*module.split("."))) if module else folder
        if local.with_suffix(".py").is_file() or (local / "__init__.py").is_file():
            entry_point = f"{package}.{module}:{attr}" if module else f"{package}:{attr}"
        else:
            entry_point = entry["entry_point"]
        default_catalog.register(entry["id"], entry_point, kind=entry.get("kind"),
                                 tags=list(entry.get("tags", [])),
                                 description=entry.get("description", ""),
                                 source=f"manifest:{folder / MANIFEST}")
    return [entry["id"] for entry in entries]


def validation_card(validation: dict[str, Any] | None, force: bool) -> dict[str, str]:
    """The card's summary of a validation report; refuses a failed one unless `force`."""
    if validation is None:
        return {}
    checked = validation.get("tasks_checked", 0)
    card = {"ok": str(bool(validation.get("ok"))).lower(),
            "oracle": f"{validation.get('oracle_pass_rate', 0):.0%} pass over {checked} tasks",
            "noop": f"{validation.get('noop_pass_rate', 0):.0%} pass",
            "adversarial": _adversarial_summary(validation)}
    if not validation.get("ok"):
        bad = [t for t in validation.get("tasks", []) if t.get("oracle") and not _task_ok(t)]
        if not force:
            raise ReleaseError(f"{validation.get('env_id')}: validation failed ({card['oracle']}, "
                               f"no-op {card['noop']}, adversarial {card['adversarial']}; "
                               f"{len(bad)} bad task(s)); fix the env, or --force publishes "
                               "it anyway and records that in the dataset card")
        card["forced"] = "published although validation failed"
    return card


def _adversarial_summary(validation: dict[str, Any]) -> str:
    """What the report says its adversaries covered (`ValidationReport.covered`: played and
    skipped, by reason; what beat a task); a report of an earlier Corral, its counts."""
    if not validation.get("adversarial"):
        return "not run"
    covered = validation.get("covered") or []
    if len(covered) > 1 and covered[1].startswith("adversarial: "):
        return covered[1].removeprefix("adversarial: ")
    return (f"{len(validation.get('hacks', []))} hacks, {validation.get('hackable', 0)} "
            "task(s) hackable")


def _task_ok(task: dict[str, Any]) -> bool:
    from corral.registry.validate import TaskCheck

    return TaskCheck.model_validate(task).ok


def build_release(folder: str | Path, *, env_id: str | None = None, version: str | None = None,
                  validation: Any = None, validate_limit: int | None = None,
                  license: str | None = None, out_dir: Path | None = None,
                  limits: Limits = DEFAULT_LIMITS, adversarial: bool = False,
                  force: bool = False,
                  on_files: Callable[[dict[str, Path]], None] | None = None) -> BuiltRelease:
    """Pack the env folder into a release archive under `out_dir` (a temp dir by default).

    `validation` is a `ValidationReport` (or its dict) to attach; with `validate_limit` and no
    report, `corral.registry.validate` runs on that many tasks first (0 = all; `adversarial`
    adds the hack agents) and its report is attached. A failed validation refuses the release
    (ReleaseError) unless `force`, which the dataset card then records. `on_files(files)` is
    called with the files to pack (relative path -> file; `.corralignore` applied) before
    anything is loaded, validated or packed.
    """
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise ReleaseError(f"{folder} is not a folder")
    top, entries = read_entries(folder)
    entry = pick_entry(folder, entries, env_id)
    version = version or entry.get("version") or top.get("version")
    if not version:
        raise ReleaseError(f"{entry['id']}: no version; pass --version X.Y.Z or set version in "
                           f"{MANIFEST}")
    SemVer.parse(str(version))  # refuse a bad version before the expensive part
    report = _validation_dict(validation)
    if report is not None and report.get("env_id", entry["id"]) != entry["id"]:
        # Attached, another env's report would be shown on this env's card as its validation.
        raise ReportMismatch(f"the validation report is of {report.get('env_id')}, not "
                           f"{entry['id']}; attach the report of `corral validate "
                           f"{entry['id']} --json FILE`")
    files = collect_files(folder, limits)
    if on_files is not None:
        on_files(files)
    check_relative_imports(folder, files)
    rel_ep = relative_entry_point(folder, entry["entry_point"])
    cls = load_class(folder, rel_ep, entry["entry_point"])
    _check_dockerfile(entry["id"], cls)
    if validation is None and validate_limit is not None:
        validation = run_validation(cls, validate_limit, adversarial, entry["id"])
    validation = _validation_dict(validation)
    checked_card = validation_card(validation, force)
    sandbox = cls.sandbox_spec.model_dump(mode="json") if cls.sandbox_spec is not None else None
    entries_by_path = file_entries(files)
    provenance = {"folder": folder.name, "entry_point": entry["entry_point"],
                  "dataset_source": folder_relative(str(cls.tasks.source), folder)}
    if commit := _git_commit(folder):
        provenance["git_commit"] = commit
    licence = license or entry.get("license") or top.get("license") or _default_license(folder)
    tools, _ = collect(cls)
    card, dataset_hash = build_dataset_card(cls, folder, licence, provenance)
    card.validation = checked_card
    manifest = ReleaseManifest(
        id=entry["id"], version=str(version), kind=entry.get("kind") or cls.kind,
        entry_point=rel_ep, description=entry.get("description", ""),
        tags=list(entry.get("tags", cls.tags)), max_turns=cls.max_turns,
        files=entries_by_path, content_sha256=content_digest(entries_by_path),
        dataset_sha256=dataset_hash,
        image_recipe_sha256=image_recipe_hash(sandbox, files, entries_by_path),
        corral_version=corral_version,
        card=card,
        tools=[spec.schema() for spec in tools.values()], sandbox=sandbox,
        validation=validation)
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="corral-release-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"{manifest.id.replace('/', '__')}-{manifest.version}.tar.gz"
    with open(archive, "wb") as fh:
        pack(manifest, files, fh)
    return BuiltRelease(manifest, archive, archive_digest(archive))

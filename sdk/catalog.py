"""The in-process catalog: ids → specs → environments, in the spirit of Gymnasium's
`registration.py`, but an object (`Catalog`) with thin module-level functions over a default one.

Ids are `namespace/name-vN`. An unversioned id resolves to the latest registered version; a
deprecated version raises naming its replacement. Specs can be *lazy*: registered from a
manifest (the `corral.envs` entry-point group of installed packages here; the built-in
`corral.toml` manifests and installed releases are added as sources by `corral.registry`) with an
entry point string, so nothing is imported until `make`.

The catalog lives in the SDK (as Gymnasium keeps registration in its core package) so that
`@cr.environment` and `cr.load_harbor` register without importing the registry.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import logging
import re
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

import gymnasium
from gymnasium.envs.registration import EnvSpec as GymnasiumSpec

from corral.errors import (
    DeprecatedEnv,
    DuplicateRegistration,
    InvalidEnvId,
    RegistryError,
    UnknownEnv,
)
from corral.suggest import closest

__all__ = ["Catalog", "ENTRY_POINT_GROUP", "EnvSpec", "GymEntry", "ID_RE", "PLUGIN_GROUP",
           "default_catalog", "deprecate", "gymnasium_spec", "make", "parse_id", "register",
           "register_gymnasium_envs", "spec"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "corral.envs"
# Packages that extend the default catalog (sources of specs, guards) declare a
# `corral.catalog` entry point: 'module:function', called with the catalog before its first
# lookup. Corral's own registry is one (built-in manifests, installed releases, lock files), so
# `corral.catalog.make` finds the built-in envs in a fresh interpreter without the SDK naming
# the layer above it.
PLUGIN_GROUP = "corral.catalog"
# Set inside `Catalog.unlisted()`: registrations describe the env but add nothing to any catalog.
_UNLISTED: ContextVar[bool] = ContextVar("corral_catalog_unlisted", default=False)
ID_RE = re.compile(r"^(?P<namespace>[a-z0-9][a-z0-9_.-]*)/(?P<name>[A-Za-z0-9][\w.-]*?)"
                   r"(?:-v(?P<version>\d+))?$")


def parse_id(env_id: str, *, require_version: bool = False) -> tuple[str, str, int | None]:
    """Split `ns/name-vN` into its parts; raise `InvalidEnvId` with the expected form."""
    match = ID_RE.match(env_id) if isinstance(env_id, str) else None
    if match is None:
        raise InvalidEnvId(f"Malformed environment id {env_id!r}: expected 'namespace/name-vN' "
                           "(lowercase namespace, e.g. 'acme/fix-perms-v1')")
    version = match.group("version")
    if require_version and version is None:
        raise InvalidEnvId(f"Environment id {env_id!r} needs a version suffix, e.g. "
                           f"'{env_id}-v0'")
    return match.group("namespace"), match.group("name"), None if version is None else int(version)


@dataclass
class EnvSpec:
    """Everything the catalog knows about one registered environment version."""

    id: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    kind: str | None = None
    tags: list[str] = field(default_factory=list)
    description: str = ""
    deprecated: str | None = None  # the replacement id, when deprecated
    source: str = "code"  # "code" | "manifest:<path>" | "entry-point:<dist>"
    metadata: dict[str, Any] = field(default_factory=dict)
    override: bool = False  # registered from code to replace a built-in or installed env

    @property
    def namespace(self) -> str:
        return parse_id(self.id)[0]

    @property
    def name(self) -> str:
        return parse_id(self.id)[1]

    @property
    def version(self) -> int:
        return parse_id(self.id)[2] or 0

    @property
    def loaded(self) -> bool:
        return not isinstance(self.entry_point, str)

    @property
    def entry_point_path(self) -> str:
        """`module:QualName` of the entry point, loaded or not."""
        ep = self.entry_point
        if isinstance(ep, str):
            return ep
        # an entry point that resolved to a constant (an instance, a number) has no qualname
        module, name = getattr(ep, "__module__", None), getattr(ep, "__qualname__", None)
        return f"{module}:{name}" if module and name else repr(ep)

    def load(self) -> Callable[..., Any]:
        """Import the entry point (once) and return the env class or factory."""
        if isinstance(self.entry_point, str):
            module_name, _, attr = self.entry_point.partition(":")
            if not attr:
                raise RegistryError(f"{self.id}: entry point {self.entry_point!r} must look "
                                    "like 'package.module:ClassName'")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise RegistryError(f"{self.id}: cannot import {module_name} ({exc})") from exc
            target: Any = module
            for part in attr.split("."):
                target = getattr(target, part, None)
                if target is None:
                    raise RegistryError(f"{self.id}: {module_name} has no {attr}")
            self.entry_point = target
        return self.entry_point

    def make(self, **overrides: Any) -> Any:
        """An instance of the entry point with the spec's kwargs (`overrides` replace them). An
        env class registered by id alone (a manifest's entry, no id in `@cr.environment`) learns
        its id and the spec's tags here: errors and logs name it. An entry point that is not an
        `Env` class, or a factory that returns something other than an `Env`, is a
        `RegistryError` naming the id, the entry point and what it resolved to (it used to be
        an AttributeError deep inside `info` or `run`)."""
        from .env import Env  # here, not at import: listing the catalog needs no env machinery

        where = self.entry_point_path  # before `load` replaces the string with its target
        target = self.load()
        if isinstance(target, type) and not issubclass(target, Env):
            raise RegistryError(f"{self.id}: entry point {where} is the class "
                                f"{target.__qualname__}, which is not an Env subclass; "
                                "subclass cr.TextEnv, cr.TerminalEnv or cr.BrowserEnv")
        if not callable(target):
            raise RegistryError(f"{self.id}: entry point {where} is {_described(target)}, not "
                                "an Env class or a function returning an Env")
        env = target(**{**self.kwargs, **overrides})
        if not isinstance(env, Env):
            raise RegistryError(f"{self.id}: entry point {where} returned {_described(env)}, "
                                "not an Env")
        if env.env_id is None:
            env.env_id = self.id
        if self.tags:  # a manifest's tags (an env listed there need not repeat them in code)
            env.tags = tuple(self.tags)
        return env


class Catalog:
    """A set of environment specs, with lookup, creation and listing."""

    def __init__(self, *, entry_points: bool = True, plugins: bool = False) -> None:
        """`entry_points`: read installed packages' `corral.envs` entry points; `plugins`: call
        the `corral.catalog` entry points before the first lookup (the default catalog does)."""
        self._specs: dict[str, EnvSpec] = {}
        self._lock = threading.RLock()
        self._lazy_sources: list[tuple[Callable[[], Iterable[EnvSpec]], bool]] = []
        self._guards: list[Callable[[EnvSpec], None]] = []
        # called with every id added to (spec) or removed from (None) the catalog: the
        # Gymnasium registry mirrors the default catalog this way (`corral.gym`)
        self._listeners: list[Callable[[str, EnvSpec | None], None]] = []
        # id -> why its code registration may not be used: it shadows a spec that a lazy
        # source (built-in manifest, installed release) brought in after it was registered.
        self._shadowed: dict[str, str] = {}
        self._plugins = plugins
        if entry_points:
            self._lazy_sources.append((_entry_point_specs, False))
        self._discovered = not self._lazy_sources and not plugins

    # --- registration ------------------------------------------------------------------------
    def register(self, id: str, entry_point: str | Callable[..., Any], *,
                 kwargs: dict[str, Any] | None = None, kind: str | None = None,
                 tags: list[str] | None = None, description: str = "",
                 deprecated: str | None = None, source: str = "code", override: bool = False,
                 **metadata: Any) -> EnvSpec:
        """Register `entry_point` (a class/factory, or 'module:Name') under `id`.

        An id that is taken by another entry point (registered from code, a built-in manifest
        or an installed release) raises `DuplicateRegistration`, now or at the first lookup of
        `id` if the other source is read later; `override=True` replaces it on purpose.
        """
        parse_id(id, require_version=True)
        spec = EnvSpec(id, entry_point, dict(kwargs or {}), kind, list(tags or []), description,
                       deprecated, source, metadata, override)
        if _UNLISTED.get():
            return spec
        with self._lock:
            existing = self._specs.get(id)
            self._shadowed.pop(id, None)
            if existing is not None and not _same_target(existing, spec):
                if not override:
                    raise DuplicateRegistration(_shadow_message(spec, existing))
                existing = None
            if existing is not None:  # a lazy manifest entry being filled in by its module
                # a manifest's (or a release's) id, tags and description are the env's, not code's
                listed = existing.source.startswith(("manifest:", "release:"))
                first, second = (existing, spec) if listed else (spec, existing)
                spec = replace(existing, entry_point=entry_point,
                               kind=kind or existing.kind, tags=first.tags or second.tags,
                               description=first.description or second.description,
                               metadata={**existing.metadata, **metadata})
            self._specs[id] = spec
        self._notify(id, spec)
        return spec

    @staticmethod
    @contextmanager
    def unlisted() -> Any:
        """Registrations made inside (by `@cr.environment` of a module imported here) are not
        added to any catalog: `corral publish` imports an env folder to describe it, which must
        neither add it nor clash with an installed release of the same id."""
        token = _UNLISTED.set(True)
        try:
            yield
        finally:
            _UNLISTED.reset(token)

    def deprecate(self, id: str, replacement: str) -> None:
        """Mark `id` deprecated in favour of `replacement`."""
        self.spec(id).deprecated = replacement

    def add_source(self, source: Callable[[], Iterable[EnvSpec]], *,
                   override: bool = False) -> None:
        """Add a lazy source of specs, read at the first lookup (at once if that has happened).
        With `override`, its specs replace same-id specs whose code is not imported yet
        (installed releases take precedence over built-in manifests)."""
        with self._lock:
            if self._discovered:
                self._merge(source, override)
            else:
                self._lazy_sources.append((source, override))

    def add_listener(self, listener: Callable[[str, EnvSpec | None], None]) -> None:
        """Call `listener(id, spec)` for every spec added from now on (registered from code or
        read from a source) and `listener(id, None)` for every id unregistered."""
        self._listeners.append(listener)

    def _notify(self, id: str, spec: EnvSpec | None) -> None:
        for listener in self._listeners:
            listener(id, spec)

    def add_guard(self, guard: Callable[[EnvSpec], None]) -> None:
        """Call `guard(spec)` before every `make`; it raises to refuse (e.g. a `corral.lock`)."""
        self._guards.append(guard)

    def unregister(self, id: str) -> None:
        with self._lock:
            removed = self._specs.pop(id, None)
            self._shadowed.pop(id, None)
        if removed is not None:
            self._notify(id, None)

    # --- lookup ------------------------------------------------------------------------------
    def _discover(self) -> None:
        if self._discovered:
            return
        with self._lock:
            if self._discovered:
                return
            if self._plugins:
                self._plugins = False
                for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
                    ep.load()(self)  # adds its sources to _lazy_sources (not yet discovered)
            self._discovered = True
            for source, override in self._lazy_sources:
                self._merge(source, override)

    def _merge(self, source: Callable[[], Iterable[EnvSpec]], override: bool) -> None:
        for spec in source():
            current = self._specs.get(spec.id)
            if current is None or (override and not current.loaded):
                self._specs[spec.id] = spec
                self._notify(spec.id, spec)
            elif (current.source == "code" and not current.override
                  and not _same_target(current, spec)):
                self._shadowed[spec.id] = _shadow_message(current, spec)

    def spec(self, id: str) -> EnvSpec:
        """The spec for `id`; an unversioned id resolves to the latest version."""
        self._discover()
        namespace, name, version = parse_id(id)
        if version is not None:
            spec = self._specs.get(id)
            if spec is None:
                raise UnknownEnv(self._unknown_message(id, namespace, name))
        else:
            versions = [s for s in self._specs.values()
                        if s.namespace == namespace and s.name == name and not s.deprecated]
            if not versions:
                raise UnknownEnv(self._unknown_message(id, namespace, name))
            spec = max(versions, key=lambda s: s.version)
        if spec.id in self._shadowed:
            raise DuplicateRegistration(self._shadowed[spec.id])
        return spec

    def make(self, id: str, **overrides: Any) -> Any:
        """Create an environment instance; `overrides` replace the spec's kwargs."""
        spec = self.spec(id)
        if spec.deprecated:
            raise DeprecatedEnv(f"Environment version `{spec.id}` is deprecated. "
                                f"Please use `{spec.deprecated}` instead.")
        for guard in self._guards:
            guard(spec)
        env = spec.make(**overrides)
        # what Gymnasium's `check_env` and `gymnasium.make(env.spec)` re-make the env from
        env.spec = gymnasium_spec(spec.id, overrides, None if self is default_catalog else self)
        return env

    def list(self, pattern: str | None = None) -> list[EnvSpec]:
        """Specs whose id matches the glob `pattern` (all if None), sorted by id."""
        self._discover()
        with self._lock:
            specs = list(self._specs.values())
        if pattern:
            specs = [s for s in specs if fnmatch.fnmatchcase(s.id, pattern)
                     or fnmatch.fnmatchcase(s.id, pattern + "-v*")]
        return sorted(specs, key=lambda s: s.id)

    def __contains__(self, id: str) -> bool:
        try:
            self.spec(id)
        except (UnknownEnv, InvalidEnvId):
            return False
        return True

    def __len__(self) -> int:
        self._discover()
        return len(self._specs)

    def _unknown_message(self, id: str, namespace: str, name: str) -> str:
        in_namespace = [s for s in self._specs.values() if s.namespace == namespace]
        if not in_namespace:
            namespaces = sorted({s.namespace for s in self._specs.values()})
            return (f"Namespace `{namespace}` has no environments ({id!r})."
                    + closest(namespace, namespaces))
        names = {s.name for s in in_namespace}
        if name in names:
            versions = sorted(s.id for s in in_namespace if s.name == name)
            return f"Environment {id!r} doesn't exist. Registered versions: {', '.join(versions)}."
        hint = closest(f"{namespace}/{name}", [s.id for s in self._specs.values()])
        return f"Environment `{name}` doesn't exist in namespace `{namespace}`.{hint}"


def _described(value: Any) -> str:
    """`a dict ({'not': 'an env'})`: a value's type and a short repr, for error messages."""
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return f"{article} {kind} ({value!r:.60})"


def _shadow_message(new: EnvSpec, old: EnvSpec) -> str:
    where = {"code": "from code"}.get(old.source, f"by {old.source}")
    return (f"Environment {new.id!r} is already registered {where} (entry point "
            f"{old.entry_point_path}); bump the version to register {new.entry_point_path}, or "
            "pass override=True to replace it on purpose")


def _same_target(a: EnvSpec, b: EnvSpec) -> bool:
    return a.entry_point is b.entry_point or a.entry_point_path == b.entry_point_path


def _entry_point_specs() -> list[EnvSpec]:
    """Specs of installed packages' `corral.envs` entry points: name = env id, value =
    'module:Class'. Reading them imports nothing."""
    specs = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            parse_id(ep.name, require_version=True)
        except InvalidEnvId as exc:
            log.warning("ignoring entry point %s from %s: %s", ep.name,
                        getattr(ep.dist, "name", "?"), exc)
            continue
        dist = getattr(ep.dist, "name", "?")
        specs.append(EnvSpec(ep.name, ep.value, source=f"entry-point:{dist}"))
    return specs



default_catalog = Catalog(plugins=True)
"""The catalog that `@cr.environment`, `cr.register` and `cr.make` act on."""


# --- Gymnasium's registry -------------------------------------------------------------------
# `import corral` calls `register_gymnasium_envs()` once: every spec of the default catalog
# (built-in envs, installed releases, and everything registered later from code, an `-i` module
# or a Harbor import) gets a Gymnasium `EnvSpec` of the same id whose entry point is a
# `GymEntry`, so `gymnasium.make(id)` and `gymnasium.make_vec(id, n)` work as for any Gymnasium
# env. Gymnasium 1.x has no plugin entry points (0.26-0.29's `gymnasium.envs` group is gone):
# its packages register when imported, as `ale_py` does.


class GymEntry:
    """The entry point Gymnasium calls for a Corral id: `corral.catalog.make(id, **kwargs)`.

    It pickles as the id alone, so an `AsyncVectorEnv` worker (fork or spawn) makes the env
    from its own process's catalog: built-in and installed envs are there; an env registered
    from code is there when the module that registers it is imported in the worker too (spawn
    re-imports only the main module).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}  # as `Env.metadata`: what
    # `gymnasium.make` checks a render_mode against before the env class is imported

    def __init__(self, env_id: str, catalog: Catalog | None = None) -> None:
        self.env_id = env_id
        self.catalog = catalog

    def __call__(self, **kwargs: Any) -> gymnasium.Env:
        return (self.catalog or default_catalog).make(self.env_id, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.catalog not in (None, default_catalog):
            raise TypeError(f"{self.env_id}: an env of a private Catalog cannot be sent to "
                            "another process; register it in the default catalog")
        return (GymEntry, (self.env_id,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GymEntry) and other.env_id == self.env_id \
            and other.catalog is self.catalog

    def __hash__(self) -> int:
        return hash(self.env_id)

    def __repr__(self) -> str:
        return f"GymEntry({self.env_id!r})"


def gymnasium_spec(env_id: str, kwargs: dict[str, Any] | None = None,
                   catalog: Catalog | None = None) -> GymnasiumSpec:
    """A Gymnasium `EnvSpec` that re-makes the Corral env `env_id` with `kwargs`. Episode
    limits are the env's own (`max_turns`), so no `TimeLimit` is added."""
    return GymnasiumSpec(id=env_id, entry_point=GymEntry(env_id, catalog),
                         kwargs=dict(kwargs or {}))


def _mirror(env_id: str, spec: EnvSpec | None) -> None:
    """Keep Gymnasium's registry in step with one id of the default catalog. An id Gymnasium
    already holds for another package's env is left alone. Read with `dict.get`, so a
    registry subclass's own lookup logic (another package may install one) is not run."""
    registry = gymnasium.envs.registration.registry
    current = dict.get(registry, env_id)
    ours = current is not None and isinstance(current.entry_point, GymEntry)
    if spec is None:
        if ours:
            del registry[env_id]
    elif current is None:
        # written straight into the registry (Gymnasium's public dict): `gymnasium.register`
        # scans the whole registry for every id, which for hundreds of ids costs more than
        # the rest of `import corral`
        registry[env_id] = gymnasium_spec(env_id)


_registered = False


def register_gymnasium_envs() -> None:
    """Mirror the default catalog into Gymnasium's registry: its sources now (built-in
    manifests, installed releases, read once), and every registration from now on.
    Idempotent."""
    global _registered
    if _registered:
        return
    _registered = True
    default_catalog.add_listener(_mirror)
    _mirror_catalog()


def _mirror_catalog() -> None:
    try:
        specs = default_catalog.list()
    except Exception as exc:  # a broken plugin or store must not break Gymnasium
        log.warning("Corral envs not registered with Gymnasium: %s", exc)
        return
    for spec in specs:
        _mirror(spec.id, spec)


def register(id: str, entry_point: str | Callable[..., Any], **kwargs: Any) -> EnvSpec:
    """Register an environment in the default catalog (see `Catalog.register`)."""
    return default_catalog.register(id, entry_point, **kwargs)


def make(id: str, **overrides: Any) -> Any:
    """Create an environment from the default catalog."""
    return default_catalog.make(id, **overrides)


def spec(id: str) -> EnvSpec:
    """The spec of `id` in the default catalog."""
    return default_catalog.spec(id)


def deprecate(id: str, replacement: str) -> None:
    """Mark a version deprecated; `make` then raises naming `replacement`."""
    default_catalog.deprecate(id, replacement)

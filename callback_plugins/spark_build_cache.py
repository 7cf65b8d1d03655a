"""Keeps what the controller builds from unchanged sources on disk, between runs: compiled Jinja
templates and the modules' AnsiballZ payloads.

Ansible renders every task on every host in a forked worker, and a worker starts with no compiled
template: each role variable, condition and argument that holds Jinja is parsed, turned into
Python source and compiled again, in every worker of every run. On a no-change site.yml that was
a fifth of the controller's CPU. Jinja keeps a bytecode cache for templates that come from a
loader; Ansible compiles from strings, which Jinja never caches. This plugin gives those compiles
the same treatment as Python's __pycache__: the code object is stored under a digest of everything
that decides it (the source, the environment's syntax settings, the backslash-escaping mode of the
compile, the versions of Python, Jinja and Ansible, and the filter and test plugin files, whose
decorators decide how the code calls them) and read back instead of compiling again.

Nothing is cached when template debugging is on, when a compile fails, or when a setting cannot be
named in the digest (a callable autoescape); an unreadable entry is compiled again and replaced.

Each module a run sends is zipped with the module_utils it imports, found by parsing them all
(Ansible's recursive_finder): about 0.2 CPU-s per module, paid again by every run, because Ansible
keeps the payloads in the run's own temporary directory. The run's payload directory is made a link
to a directory of this plugin, named by a digest of the versions and of every module and module_utils
file that a payload can hold (the roles' own, those of every directory the module loaders search once
the playbook is loaded - a playbook's adjacent library/ among them - and the installed collections'),
so a changed module starts a new directory. Ansible's own lock and write-then-rename keep concurrent runs safe.

A node imports a payload's Python from the zip, and a zip holds no bytecode, so every module run on a
node compiled Ansible's module library again: about half of a module's start there (basic.py and what
it imports). A payload kept here also holds each file's bytecode beside it (an unchecked hash-based
.pyc, as Python's compileall writes them), compiled by the controller's Python. A node whose Python has
the same bytecode version (major.minor) imports that instead of compiling; any other finds the magic
number different and compiles the source as before, so the payload works on every node either way.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import glob
import hashlib
import importlib.util
import io
import marshal
import os
import shutil
import tempfile
import threading
import time
import zipfile

import ansible
import jinja2
from ansible import constants as C
from ansible.executor import module_common
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import module_loader, module_utils_loader
from ansible.release import __version__ as ansible_version
from jinja2.environment import TemplateExpression

try:
    from ansible._internal._templating._jinja_bits import AnsibleEnvironment, _TemplateCompileContext
    from ansible._internal._templating._jinja_common import _TemplateConfig
except ImportError:  # another ansible-core: run without the cache rather than guess its internals
    AnsibleEnvironment = None

DOCUMENTATION = """
    name: spark_build_cache
    type: aggregate
    short_description: keep compiled Jinja templates and module payloads between runs
    description:
      - Stores the code object of each template or expression the controller compiles, keyed by a digest of
        everything that decides it, and reads it back in later runs and other workers instead of compiling again.
      - Keeps the modules' AnsiballZ payloads in a directory named by a digest of the module sources, instead of
        the run's temporary directory, each with its Python files' bytecode beside them (used by a node whose Python
        has the controller's bytecode version, ignored by any other).
      - Has no output and changes nothing on any host; it needs no enabling.
    options:
      cache_dir:
        description:
          - Where they are kept, one subdirectory per generation of what decides them; a generation that no run
            used for a week is removed. An empty value turns both caches off.
        default: ~/.cache/spark-ansible
        env:
          - name: SPARK_BUILD_CACHE_DIR
        ini:
          - section: spark_build_cache
            key: cache_dir
"""

_UNUSED_FOR = 7 * 24 * 3600  # seconds after which another generation's directory is removed
# A generation keeps the entries of every template text it ever compiled (edited role variables leave their
# old texts behind), and every run reads them all; past this many it starts empty again, which costs one run
# its compiles (a site.yml compiles about a thousand).
_MAX_TEMPLATES = 5000

_ENCODED_SETTINGS = (
    "block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
    "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
    "trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "optimized", "is_async",
)


class _Store:
    """The cache directory of this generation; every method is safe to call from any worker."""

    def __init__(self, directory: str):
        self.directory = directory
        self.pending = threading.local()
        # Read once here, in the main process, and inherited by every worker it forks: a worker that opened
        # an entry per template it compiles spent more on the files than on the code (the same entries, read
        # again by each of a run's hundreds of workers); reading them all costs a few tens of milliseconds per run.
        self.entries: dict[str, bytes] = {}
        with contextlib.suppress(OSError), os.scandir(directory) as found:
            for entry in found:
                if not entry.name.startswith("."):
                    with contextlib.suppress(OSError), open(entry.path, "rb") as kept:
                        self.entries[entry.name] = kept.read()

    def key(self, env, kind: str, source: str, *extra) -> str | None:
        if env._debuggable_template_source or not isinstance(env.autoescape, bool):  # noqa: SLF001
            return None
        compile_context = _TemplateCompileContext.current(optional=True)
        parts = [kind, *(repr(getattr(env, name)) for name in _ENCODED_SETTINGS),
                 repr(env.autoescape), repr(sorted(env.extensions)), type(env).__qualname__,
                 env.code_generator_class.__qualname__, repr(getattr(env.finalize, "__qualname__", env.finalize)),
                 repr(compile_context.escape_backslashes if compile_context else None),
                 repr(_TemplateConfig.allow_embedded_templates), *map(repr, extra), source]
        return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()

    def load(self, key: str):
        try:
            data = self.entries.get(key)
            if data is None:  # kept by a run or worker that started after this run read the directory
                with open(os.path.join(self.directory, key), "rb") as entry:
                    data = entry.read()
            return marshal.loads(data)  # noqa: S302 - written by this plugin, in a directory only its user can write
        except (OSError, EOFError, ValueError, TypeError):
            return None

    def save(self, key: str, code) -> None:
        temporary = None
        try:
            handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".")
            with os.fdopen(handle, "wb") as entry:
                marshal.dump(code, entry)
            os.replace(temporary, os.path.join(self.directory, key))
        except (OSError, ValueError):  # a full disk, or a constant marshal cannot write: compiled, not kept
            if temporary:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)


_store: _Store | None = None
_original_compile = jinja2.Environment.compile
_original_compile_expression = AnsibleEnvironment.compile_expression if AnsibleEnvironment else None


def _cached_compile(self, source, name=None, filename=None, raw=False, defer_init=False):  # noqa: PLR0917 - Jinja's signature
    store = _store
    if store is None or raw:
        return _original_compile(self, source, name, filename, raw, defer_init)
    if isinstance(source, str):
        key = store.key(self, "template", source, name, filename, defer_init)
    else:  # the parsed expression of _cached_compile_expression below
        key, store.pending.key = getattr(store.pending, "key", None), None
    code = store.load(key) if key else None
    if code is None:
        code = _original_compile(self, source, name, filename, raw, defer_init)
        if key:
            store.save(key, code)
    return code


def _cached_compile_expression(self, source, undefined_to_none=True):
    store = _store
    key = store.key(self, "expression", source, undefined_to_none) if store else None
    if key is None:
        return _original_compile_expression(self, source, undefined_to_none)
    code = store.load(key)
    if code is not None:
        return TemplateExpression(self.template_class.from_code(self, code, self.make_globals(None), None), undefined_to_none)
    store.pending.key = key
    try:
        return _original_compile_expression(self, source, undefined_to_none)
    finally:
        store.pending.key = None


def _digest(kind: str, files: list[str], layout: bytes = b"") -> str:
    """A generation's name: the versions, the layout of what it holds, and the content of every file that decides it."""
    digest = hashlib.sha256(b"%s %s %s %s %s" % (kind.encode(), importlib.util.MAGIC_NUMBER, jinja2.__version__.encode(),
                                                 ansible_version.encode(), layout))
    for path in sorted(set(files)):
        with contextlib.suppress(OSError), open(path, "rb") as source:
            digest.update(b"\0%s\0%s" % (os.path.abspath(path).encode(), hashlib.sha256(source.read()).digest()))
    return f"{kind}-{digest.hexdigest()[:32]}"


def _collection_manifests() -> list[str]:
    """An installed collection's MANIFEST.json (its files' checksums, so it changes with any of them); for a
    collection that is a source tree instead - this checkout, which scripts/bootstrap links into .collections
    under the collection's name - every Python file its plugins and roles hold."""
    files = []
    for collections_dir in C.COLLECTIONS_PATHS:
        for collection in sorted(glob.glob(os.path.join(collections_dir, "ansible_collections", "*", "*"))):
            manifest = os.path.join(collection, "MANIFEST.json")
            if os.path.isfile(manifest):
                files.append(manifest)
                continue
            files += glob.glob(os.path.join(collection, "plugins", "**", "*.py"), recursive=True)
            files += glob.glob(os.path.join(collection, "roles", "*", "*", "**", "*.py"), recursive=True)
    return files


def _template_generation() -> str:
    """What decides the compiled code besides a template's own text and settings."""
    files = []
    for roles_dir in C.DEFAULT_ROLES_PATH:
        files += glob.glob(os.path.join(roles_dir, "*", "filter_plugins", "*.py"))
        files += glob.glob(os.path.join(roles_dir, "*", "test_plugins", "*.py"))
    for plugin_dir in (*C.DEFAULT_FILTER_PLUGIN_PATH, *C.DEFAULT_TEST_PLUGIN_PATH):
        files += glob.glob(os.path.join(plugin_dir, "*.py"))
    return _digest("jinja", files + _collection_manifests())


def _payload_generation() -> str:
    """Every file an AnsiballZ payload can be built from, besides Ansible's own and the collections' (their
    manifests): the roles' library and module_utils, and every other directory the module loaders search,
    a playbook's adjacent library/ included (the playbook is loaded by now)."""
    files = []
    for roles_dir in C.DEFAULT_ROLES_PATH:
        files += glob.glob(os.path.join(roles_dir, "*", "library", "**", "*.py"), recursive=True)
        files += glob.glob(os.path.join(roles_dir, "*", "module_utils", "**", "*.py"), recursive=True)
    own = os.path.dirname(ansible.__file__) + os.sep
    for loader in (module_loader, module_utils_loader):
        for directory in loader.print_paths().split(os.pathsep):
            if directory and not os.path.join(directory, "").startswith(own) and "ansible_collections" not in directory:
                files += glob.glob(os.path.join(directory, "**", "*.py"), recursive=True)
    return _digest("ansiballz", files + _collection_manifests(), _PAYLOAD_LAYOUT)


# Payloads of an older layout (without bytecode) belong to another generation.
_PAYLOAD_LAYOUT = b"pyc-beside-py"


def _with_bytecode(zip_data: bytes) -> bytes:
    """The base64 payload zip again, each .py followed by its .pyc; on any trouble, the payload as it was."""
    try:
        source = zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data)))
        out = io.BytesIO()
        with zipfile.ZipFile(out, mode="w", compression=zipfile.ZIP_DEFLATED) as target:
            names = set(source.namelist())
            for info in source.infolist():
                data = source.read(info)
                target.writestr(info, data)
                if info.filename.endswith(".py") and info.filename + "c" not in names:
                    code = compile(data, info.filename, "exec", dont_inherit=True)
                    # PEP 552: magic, flags 0b01 (hash-based, not checked against the source), source hash, code.
                    pyc = (importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")
                           + importlib.util.source_hash(data) + marshal.dumps(code))
                    target.writestr(_sibling(info, info.filename + "c"), pyc)
        return base64.b64encode(out.getvalue())
    except (SyntaxError, ValueError, zipfile.BadZipFile):
        return zip_data


def _sibling(info: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    sibling = zipfile.ZipInfo(name, date_time=info.date_time)
    sibling.compress_type = zipfile.ZIP_DEFLATED
    sibling.external_attr = info.external_attr
    return sibling


def _dump_with_bytecode(self, path: str) -> None:
    _original_dump(dataclasses.replace(self, zip_data=_with_bytecode(self.zip_data)), path)


_original_dump = module_common._CachedModule.dump


def _generation_directory(root: str, generation: str) -> str | None:
    """This generation's directory under root, made if missing and marked as used now.

    Other generations of its kind are removed once no run has used them for a week: another checkout
    of the project, with other module sources, may be using its own generation at this moment.
    """
    directory = os.path.join(root, generation)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.utime(directory)
    except OSError:
        return None
    kind = generation.split("-", 1)[0]
    for other in glob.glob(os.path.join(root, f"{kind}-*")):
        with contextlib.suppress(OSError):
            if other != directory and time.time() - os.stat(other).st_mtime > _UNUSED_FOR:
                shutil.rmtree(other, ignore_errors=True)
    return directory


def _private_directory(path: str) -> bool:
    """Made if missing; usable only if this user owns it and nobody else can write to it (its entries are run)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        stat = os.stat(path)
    except OSError:
        return False
    return stat.st_uid == os.geteuid() and not stat.st_mode & 0o022


def _install_templates(root: str) -> None:
    global _store  # noqa: PLW0603 - the workers fork from this process and inherit it
    if _store is not None or not root:
        return
    root = os.path.expanduser(root)
    if AnsibleEnvironment is not None and _private_directory(root) and (
            directory := _generation_directory(root, _template_generation())):
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            if sum(1 for _ in entries) > _MAX_TEMPLATES:
                shutil.rmtree(directory, ignore_errors=True)
                os.makedirs(directory, mode=0o700, exist_ok=True)
        _store = _Store(directory)
        AnsibleEnvironment.compile = _cached_compile
        AnsibleEnvironment.compile_expression = _cached_compile_expression


def _install_payloads(root: str) -> None:
    """Before the first task: the run's payload directory becomes a link to this generation's."""
    payloads = os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache")
    if not root or os.path.lexists(payloads):
        return
    root = os.path.expanduser(root)
    if _private_directory(root) and (directory := _generation_directory(root, _payload_generation())):
        with contextlib.suppress(OSError):
            os.symlink(directory, payloads)
            # Only the payloads kept here get bytecode: the dump below writes them for later runs.
            module_common._CachedModule.dump = _dump_with_bytecode


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "spark_build_cache"
    CALLBACK_NEEDS_ENABLED = False

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        _install_templates(self.get_option("cache_dir"))

    def v2_playbook_on_start(self, playbook):
        _install_payloads(self.get_option("cache_dir"))

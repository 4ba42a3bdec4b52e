"""Record the top-level modules every Python process imports, when ``FP8RL_IMPORT_LOG`` names a folder.

On ``PYTHONPATH`` (this folder), Python imports this module at start-up in every process that inherits the
environment — a verl run's trainer, its Ray workers and Ray's own processes, vLLM's engine processes. Without
``FP8RL_IMPORT_LOG`` it does nothing. With it, each process appends to ``<folder>/<pid>.log``: the top-level
modules already loaded at start-up, then each top-level module the moment a finder finds it (a meta-path
finder ahead of the others: a name no finder finds — a failed optional import — is not written), one a line
(``name<TAB>importer<TAB>file``: the module whose code imported it, where it was found), and ``#title <command
line>`` whenever the process's title (``/proc/self/cmdline``: Ray and vLLM rename their workers) changed since
the last line. Written as it goes, so a worker killed without running ``atexit``
handlers keeps what it imported; at exit the whole of ``sys.modules`` once more. A forked child writes a file
of its own with what it imports after the fork; a process that execs another Python appends that interpreter's
record (its start-up modules begin with ``sys``). Read by tools/import_closure.py (docs/gpu.md, The GPU set's import closure).
"""

import os
import sys

_FOLDER = os.environ.get("FP8RL_IMPORT_LOG")


def _loaded():
    """The top-level names of ``sys.modules`` that are modules of that name (not a compiled submodule that
    registered itself under its short name)."""
    out = []
    for key, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if "." not in key and (spec is None or spec.name == key):
            out.append(key)
    return out


def _importer():
    """The module whose code runs the import: the first frame outside the import machinery and this file."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib", "sitecustomize")):
            return name
        frame = frame.f_back
    return ""


class _Recorder:
    """A meta-path finder that asks the finders after it and writes the top-level name of what they find."""

    def __init__(self, folder):
        self.folder = folder
        self.seen = set()
        self.title = None
        self.fd = None
        self.open()

    def open(self):
        os.makedirs(self.folder, exist_ok=True)
        self.fd = os.open(os.path.join(self.folder, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.title = None
        self.write(_loaded())

    def forked(self):
        """A forked child: a file of its own; what it inherited is its parent's record (an exec after the fork
        starts a new interpreter, which writes its own start-up modules)."""
        self.seen = set(_loaded())
        self.fd = os.open(os.path.join(self.folder, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.title = None

    def write(self, lines):
        new = [n for n in dict.fromkeys(lines) if n.partition("\t")[0] not in self.seen]
        if not new:
            return
        self.seen.update(n.partition("\t")[0] for n in new)
        try:
            with open("/proc/self/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            title = " ".join(sys.argv)
        title = " ".join(title.split())[:300]
        lines = new if title == self.title else [f"#title {title}", *new]
        self.title = title
        os.write(self.fd, ("\n".join(lines) + "\n").encode())

    def find_spec(self, name, path=None, target=None):
        if path is not None or name in self.seen:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            try:
                spec = find(name, path, target)
            except Exception:
                continue
            if spec is not None:
                origin = spec.origin or next(iter(spec.submodule_search_locations or ()), "")
                self.write((f"{name}\t{_importer()}\t{origin}",))
                return spec
        return None

    def at_exit(self):
        self.write(_loaded())


if _FOLDER:
    _recorder = _Recorder(_FOLDER)
    sys.meta_path.insert(0, _recorder)
    os.register_at_fork(after_in_child=_recorder.forked)
    import atexit

    atexit.register(_recorder.at_exit)

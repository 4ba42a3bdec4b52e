"""Record the top-level modules every Python process imports, when ``FP8RL_IMPORT_LOG`` names a folder.

On ``PYTHONPATH`` (this folder), Python imports this module at start-up in every process that inherits the
environment — a verl run's trainer, its Ray workers and Ray's own processes, vLLM's engine processes. Without
``FP8RL_IMPORT_LOG`` it does nothing. With it, each process appends to ``<folder>/<pid>.log``: the top-level
modules already loaded at start-up, then each top-level module the moment a finder finds it (a meta-path
finder ahead of the others: a name no finder finds — a failed optional import — is not written), one a line,
and ``#title <command line>`` whenever the process's title (``/proc/self/cmdline``: Ray and vLLM rename their
workers) changed since the last line. Written as it goes, so a worker killed without running ``atexit``
handlers keeps what it imported; at exit the whole of ``sys.modules`` once more. A forked child writes a file
of its own. Read by tools/import_closure.py (docs/gpu.md, The GPU set's import closure).
"""

import os
import sys

_FOLDER = os.environ.get("FP8RL_IMPORT_LOG")


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
        self.write(m.partition(".")[0] for m in list(sys.modules))

    def forked(self):
        self.seen = set()
        self.open()

    def write(self, names):
        new = [n for n in dict.fromkeys(names) if n not in self.seen]
        if not new:
            return
        self.seen.update(new)
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
                self.write((name,))
                return spec
        return None

    def at_exit(self):
        self.write(m.partition(".")[0] for m in list(sys.modules))


if _FOLDER:
    _recorder = _Recorder(_FOLDER)
    sys.meta_path.insert(0, _recorder)
    os.register_at_fork(after_in_child=_recorder.forked)
    import atexit

    atexit.register(_recorder.at_exit)

"""Starting `sapient serve` on a free loopback port for the server tests, and waiting for it."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, model, alias, *extra):
    """Runs `binary serve -m model --alias alias -t 2 *extra` on a free port; returns (process,
    port) once /health answers ok, or exits naming why not within 60 s."""
    port = free_port()
    proc = subprocess.Popen(
        [binary, "serve", "-m", model, "--port", str(port), "--alias", alias, "-t", "2", *extra],
        stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if json.load(r)["status"] == "ok":
                    return proc, port
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"sapient serve exited: {proc.stderr.read()}")
            time.sleep(0.1)
    raise SystemExit("sapient serve did not come up in 60 s")


@contextlib.contextmanager
def served(binary, model, alias, *extra):
    """`start` as a context: yields the port; the server gets SIGTERM and is waited for at the
    end."""
    proc, port = start(binary, model, alias, *extra)
    try:
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@contextlib.contextmanager
def served_with_template(binary, model, alias, template, *extra):
    """`served` with `--chat-template-file` naming a file that holds `template`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "template.jinja")
        with open(path, "w") as f:
            f.write(template)
        with served(binary, model, alias, "--chat-template-file", path, *extra) as port:
            yield port

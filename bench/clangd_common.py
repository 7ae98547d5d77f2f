"""Shared by the clangd benchmarks: a one-file torch (or tt) project and a
minimal LSP client over a server's stdin/stdout."""
import json
import os
import subprocess
import threading
import time


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_project(work, copies, torch=True):
    """work/main.cpp: #include <torch/torch.h> (or tt) followed by COPIES copies of
    bench/analysis_inputs/model_code.inc written into the main file (clangd reuses
    the preamble, so only main-file code is re-parsed), and its
    compile_commands.json. Returns (source path, compile arguments)."""
    code = open(os.path.join(ROOT, "bench", "analysis_inputs", "model_code.inc")).read()
    if torch:
        head, flags = "#include <torch/torch.h>\nnamespace T = torch;\n", [
            "-isystem", "/usr/include/torch/csrc/api/include"]
    else:
        head, flags = '#include "tt/tt.h"\nnamespace T = tt;\n', [
            "-I" + os.path.join(ROOT, "runtime", "include")]
    body = "".join("namespace copy%d {\n%s}\n" % (i, code) for i in range(copies))
    src = os.path.join(work, "main.cpp")
    with open(src, "w") as f:
        f.write(head + "#include <vector>\n" + body)
    args = ["clang++-19", "-std=c++17"] + flags + ["-c", src]
    with open(os.path.join(work, "compile_commands.json"), "w") as f:
        json.dump([{"directory": work, "file": src, "arguments": args}], f)
    return src, args


class LspClient:
    def __init__(self, argv, cwd):
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.next_id = 1
        self.cond = threading.Condition()
        self.responses = {}
        self.diagnostics = []  # (arrival time, params) of every publishDiagnostics
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            msg = json.loads(out.read(length))
            with self.cond:
                if msg.get("method") == "textDocument/publishDiagnostics":
                    self.diagnostics.append((time.monotonic(), msg["params"]))
                elif "id" in msg and "method" not in msg:
                    self.responses[msg["id"]] = msg
                self.cond.notify_all()

    def _send(self, msg):
        body = json.dumps(msg).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def notify(self, method, params):
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method, params, timeout=300):
        rid = self.next_id
        self.next_id += 1
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        with self.cond:
            if not self.cond.wait_for(lambda: rid in self.responses, timeout):
                raise TimeoutError(method)
            return self.responses.pop(rid)

    def wait_diagnostics(self, uri, version, timeout=300):
        """The first publishDiagnostics for uri at version: (arrival time, diagnostics)."""
        def find():
            for t, p in self.diagnostics:
                if p["uri"] == uri and p.get("version") == version:
                    return t, p["diagnostics"]
            return None
        with self.cond:
            if not self.cond.wait_for(lambda: find() is not None, timeout):
                raise TimeoutError("diagnostics for %s v%s" % (uri, version))
            return find()

    def initialize(self, root):
        self.request("initialize", {"processId": os.getpid(), "rootUri": "file://" + root,
                                    "capabilities": {"textDocument": {"publishDiagnostics": {
                                        "versionSupport": True, "codeDescriptionSupport": True}}}})
        self.notify("initialized", {})

    def shutdown(self):
        try:
            self.request("shutdown", None, timeout=30)
            self.notify("exit", None)
            self.proc.wait(timeout=30)
        except (TimeoutError, subprocess.TimeoutExpired, BrokenPipeError):
            self.proc.kill()

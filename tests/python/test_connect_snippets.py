"""The Overview's "Point clients here" snippets (`/admin/status` `connect.snippets`), pasted and
run as a user would: the Python ones by this interpreter with the real ollama and openai
packages, the curl one by bash with the real curl, against a running `corral serve`."""
import json
import re
import subprocess
import sys
import time
import urllib.request

from conftest import _serve_over


def _snippets(proc):
    deadline = time.monotonic() + 10
    while not any("Open the UI:" in l for l in proc.seen):
        assert time.monotonic() < deadline, "".join(proc.seen)
        time.sleep(0.05)
    line = proc.last_line_with("Open the UI:")
    admin, token = re.search(r"(http://[0-9.:]+)/ui/#token=(\S+)", line).groups()
    req = urllib.request.Request(f"{admin}/admin/status", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)["connect"]


def test_every_snippet_runs_as_pasted_and_gets_an_answer(sims):
    proc, url = _serve_over(sims)
    try:
        # The nodes' models are learned by the first probe round; the snippet names one of them.
        deadline = time.monotonic() + 10
        while '"llama3.2"' not in (connect := _snippets(proc))["snippets"]["curl"]:
            assert time.monotonic() < deadline, connect
            time.sleep(0.1)
        assert connect["ollama"] == url
        snippets = connect["snippets"]
        for lang in ("python", "openai"):
            out = subprocess.run([sys.executable, "-c", snippets[lang]], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, f"{lang} snippet failed:\n{snippets[lang]}\n{out.stderr}"
            assert out.stdout.strip(), f"{lang} snippet printed the answer: {out.stdout!r}"
        out = subprocess.run(["bash", "-c", snippets["curl"]], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"curl snippet failed:\n{snippets['curl']}\n{out.stderr}"
        answer = json.loads(out.stdout)
        assert answer["done"] is True and answer["message"]["content"], answer
    finally:
        proc.stop()

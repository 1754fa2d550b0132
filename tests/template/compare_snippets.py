#!/usr/bin/python3
"""Feature-level oracle comparison: every snippet of snippets.py is rendered
by tern (`tern template DIR` on a folder holding it as chat_template.jinja)
and by jinja2 configured as transformers does (hf_oracle.make_env). Outputs
must be byte-identical; where jinja2 fails, tern must fail too (same message
for raise_exception). Needs TERN_BIN."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_oracle  # noqa: E402
from snippets import SNIPPETS  # noqa: E402


def oracle(src, variables):
    env = hf_oracle.make_env()
    try:
        tpl = env.from_string(src)
        kw = {k: v for k, v in variables.items() if k not in ("messages", "tools", "documents", "add_generation_prompt")}
        return {"text": tpl.render(messages=variables.get("messages"), tools=variables.get("tools"),
                                   documents=variables.get("documents"),
                                   add_generation_prompt=variables.get("add_generation_prompt", False), **kw)}
    except hf_oracle.TemplateRaised as e:
        return {"error": str(e), "raised": True}
    except Exception as e:  # noqa: BLE001
        return {"error": "%s: %s" % (type(e).__name__, e), "raised": False}


def main():
    tern = os.environ.get("TERN_BIN")
    if not tern:
        raise SystemExit("TERN_BIN not set")
    tmp = tempfile.mkdtemp(prefix="tern-tpl-")
    bad = 0
    try:
        for i, (src, variables) in enumerate(SNIPPETS):
            with open(os.path.join(tmp, "chat_template.jinja"), "w", encoding="utf-8", newline="") as f:
                f.write(src)
            want = oracle(src, variables)
            p = subprocess.run([tern, "template", tmp, "--jsonl"], capture_output=True, timeout=60,
                               input=(json.dumps(variables, ensure_ascii=False) + "\n").encode())
            lines = [l for l in p.stdout.decode().split("\n") if l.strip()]
            err = p.stderr.decode(errors="replace")
            if "Sanitizer" in err or "runtime error:" in err:
                got = {"crash": p.returncode, "stderr": err[-800:]}
            elif p.returncode == 1 and not lines:  # parse error: reported at load time
                got = {"error": p.stderr.decode().strip()}
            elif p.returncode != 0 or len(lines) != 1:
                got = {"crash": p.returncode, "stderr": p.stderr.decode()[-500:]}
            else:
                got = json.loads(lines[0])
            if "text" in want:
                ok = got.get("text") == want["text"]
            else:
                ok = "error" in got and (not want["raised"] or got["error"] == want["error"])
            if not ok:
                bad += 1
                print("MISMATCH snippet %d: %r\n  oracle: %r\n  tern:   %r" % (i, src[:200], want, got))
    finally:
        shutil.rmtree(tmp)
    print("snippets: %d, mismatched: %d" % (len(SNIPPETS), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

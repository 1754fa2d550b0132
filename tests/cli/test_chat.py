#!/usr/bin/env python3
"""tern chat, driven through the binary as a person would:
- piped: each answer (greedy) equals `tern run` on the same conversation
  rendered by `tern template` (the chat template is checked against jinja2
  elsewhere), so history is really sent; later turns reuse the earlier
  turns' KV (cached tokens > 0); /reset and /undo give back the prompt of a
  conversation without the dropped turns; /system sets a system message;
  a thinking model's thought is set apart ([thinking] lines) or hidden
  (--hide-thinking); an unknown command is named; a conversation outgrowing
  -c drops its oldest exchange and still answers; a model without a chat
  template is an error (exit 1);
- on a terminal (a pty): the thought is dimmed, the prompt shown, Ctrl-C
  stops a long answer ([stopped]) and the chat goes on, Ctrl-D leaves (exit
  0)."""
import json, os, pty, re, select, signal, subprocess, sys, time

TERN = os.environ["TERN_BIN"]
SRC = os.environ.get("TERN_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
SHARED = os.environ.get("TERN_SHARED", os.path.join(SRC, "..", "shared"))
DEMO = os.path.join(SRC, "models", "tern-demo")
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


def chat(lines, *args):
    p = subprocess.run([TERN, "chat", DEMO, "--temperature", "0", "-v", *args], input="".join(l + "\n" for l in lines),
                       capture_output=True, text=True, timeout=300)
    usage = [tuple(int(x) for x in m) for m in re.findall(r"\[(\d+) prompt tokens \((\d+) cached\), (\d+) generated",
                                                              p.stderr)]
    return p, usage


def reference(messages, think):
    """The greedy answer of `tern run` to the rendered conversation."""
    rq = {"messages": messages, "add_generation_prompt": True, "enable_thinking": think}
    t = subprocess.run([TERN, "template", DEMO], input=json.dumps(rq), capture_output=True, text=True, timeout=60)
    assert t.returncode == 0, t.stderr
    r = subprocess.run([TERN, "run", DEMO, "--prompt", t.stdout, "--temperature", "0", "-n", "200"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


# --- a conversation, turn by turn, against tern run on the rendered history ---
turns = ["Hello! Who are you?", "Count the words in this text: the cat sat", "Thanks! Say hi again."]
p, usage = chat(turns, "--think", "off")
check(p.returncode == 0, "piped chat exits 0 (stderr %r)" % p.stderr[-300:])

check(len(usage) == 3, "three answers with usage lines: %r" % usage)
msgs, refs = [], []
for t in turns:
    msgs.append({"role": "user", "content": t})
    refs.append(reference(msgs, False))
    msgs.append({"role": "assistant", "content": refs[-1]})
check(p.stdout.strip() == "\n".join(refs), "each turn equals tern run on the rendered history: %r vs %r" %
      (p.stdout, refs))
if len(usage) == 3:
    check(usage[1][0] > usage[0][0] + usage[0][2] and usage[2][0] > usage[1][0] + usage[1][2],
          "the prompt grows with the history: %r" % usage)
    check(usage[2][1] > 0, "the third turn reuses cached KV of the earlier turns (%d tokens)" % usage[2][1])

# --- /reset, /undo, /system --------------------------------------------------
p, usage = chat(["Hello! Who are you?", "/reset", "Hello! Who are you?", "Tell me a story.", "/undo",
                 "Hello again!", "/system You are terse.", "Hello! Who are you?", "/bogus"], "--think", "off")
check(p.returncode == 0 and len(usage) == 5, "commands run (%d answers)" % len(usage))
if len(usage) == 5:
    check(usage[1][0] == usage[0][0], "/reset: the same message gives the first prompt again (%d, %d)" %
          (usage[1][0], usage[0][0]))
    check(usage[3][0] - usage[1][0] < usage[2][0] - usage[1][0] + 8 and usage[3][0] > usage[1][0],
          "/undo: the undone exchange is not in the next prompt (%r)" % usage)
    check(usage[4][0] > usage[0][0], "/system: the system message is in the prompt (%d > %d)" %
          (usage[4][0], usage[0][0]))
check("[conversation cleared]" in p.stdout and "[last exchange taken back]" in p.stdout, "/reset and /undo say so")
check("unknown command /bogus" in p.stdout, "an unknown command is named")
sys_ref = reference([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello! Who are you?"}],
                    False)
check(sys_ref in p.stdout, "/system: the answer is tern run's with that system message (%r)" % sys_ref)

# --- thinking ---------------------------------------------------------------
p, _ = chat(["Hello! Who are you?"], "--think", "on")
m = re.search(r"\[thinking\]\n(.*?)\n\[/thinking\]\n(.*)", p.stdout, re.S)
check(m is not None and m.group(1).strip() and m.group(2).strip(), "--think on: a thought, then an answer: %r" %
      p.stdout[:200])
ref = reference([{"role": "user", "content": "Hello! Who are you?"}], True)
if m:
    check("<think>" in ref and m.group(1).strip() in ref and ref.endswith(m.group(2).strip()),
          "the thought and the answer are tern run's, split: %r" % ref)
p, _ = chat(["Hello! Who are you?"], "--think", "on", "--hide-thinking")
check(p.returncode == 0 and "[thinking]" not in p.stdout and m is not None and p.stdout.strip() == m.group(2).strip(),
      "--hide-thinking prints the answer alone: %r" % p.stdout[:120])

# --- the context: the oldest exchange goes ------------------------------------
p, usage = chat(turns, "--think", "off", "-c", "96")
check(p.returncode == 0 and len(usage) == 3 and "old exchange dropped" in p.stderr,
      "-c 96: three answers, an old exchange dropped (%r)" % usage)
p = subprocess.run([TERN, "chat", DEMO, "-c", "32"], input="word " * 200 + "\n", capture_output=True, text=True,
                   timeout=120)
check(p.returncode == 0 and "does not fit the context" in p.stderr, "a message longer than the context is named")

# --- no template --------------------------------------------------------------
stories = os.path.join(SHARED, "models", "stories260K")
if os.path.isdir(stories):
    p = subprocess.run([TERN, "chat", stories], input="hi\n", capture_output=True, text=True, timeout=60)
    check(p.returncode == 1 and "no chat template" in p.stderr, "a model without a chat template: exit 1 (%r)" %
          p.stderr.strip()[-120:])

# --- on a terminal ------------------------------------------------------------
def spawn(*args):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(TERN, [TERN, "chat", DEMO, *args])
    return pid, fd


def read_until(fd, buf, pattern, timeout):
    end = time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return False
            if not chunk:
                return False
            buf += chunk
            if re.search(pattern, bytes(buf), re.S):
                return True
    return False


def leave(pid, fd, what):
    os.write(fd, b"\x04")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "%s: Ctrl-D leaves with exit 0 (status %d)" %
          (what, status))


pid, fd = spawn("--temperature", "0", "--think", "on")
buf = bytearray()
check(read_until(fd, buf, rb"> ", 60), "a prompt on the terminal")
os.write(fd, b"Hello! Who are you?\n")
check(read_until(fd, buf, rb"\x1b\[2m.+\x1b\[0m.+\n.*> ", 60), "the thought is dimmed, then the answer and a new prompt")
leave(pid, fd, "dimmed thought")
# a long answer (sampled hot, no token cap, a fixed seed); Ctrl-C stops it
pid, fd = spawn("--temperature", "50", "--max-tokens", "0", "--seed", "7", "--think", "off")
buf = bytearray()
read_until(fd, buf, rb"> ", 60)
os.write(fd, b"Tell me a very long story.\n")
read_until(fd, buf, rb"story\.\r?\n.{20}", 30)
os.write(fd, b"\x03")
check(read_until(fd, buf, rb"\[stopped\].*> ", 60), "Ctrl-C stops the answer and the chat goes on")
leave(pid, fd, "after Ctrl-C")

print("%d failed" % failures if failures else "all chat checks passed")
sys.exit(1 if failures else 0)

#!/usr/bin/env python3
"""`trellis serve` through the official `openai` client and curl, against a real model.

Starts the server itself (one rank, or NP ranks under scripts/mpirun-local with --pp/--tp),
waits for /health, checks the API (models, completions and chat, streamed and not, stop
strings, usage, max_tokens, errors, API key, body limit, greedy output equal to `trellis
run`'s, a client dropping mid-stream), then SIGTERMs every rank and expects exit 0.

  tests/serve/openai_client_test.py --trellis build/release/launchers/trellis --np 1
  tests/serve/openai_client_test.py --trellis build/release/launchers/trellis --np 6 --pp 2 --tp 3

Prerequisites: the `openai` package (the project venv from scripts/setup-peers; this script
re-runs itself with the venv's Python when the current one lacks it), curl, and the model
(--model, $TRELLIS_SMOLLM2_GGUF or ~/.cache/trellis/models.env from scripts/setup-models).
llama-cpp-python, when installed, gives the reference prompt token counts.
Exit status: 0 all checks passed, 1 a check failed (or a bad argument), 77 a prerequisite is
missing (skipped) unless TRELLIS_REQUIRE_PEERS=1, which makes that a failure too.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

SKIP = 77
REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trellis"
VENV_PYTHON = CACHE / "venv" / "bin" / "python"
API_KEY = "trellis-test-key"

# Greedy chat prompts whose answers are compared with `trellis run` (max_tokens each).
CHAT_PROMPTS = [
    ("q1", "What is the capital of France?"),
    ("q2", "Write a haiku about the sea."),
    ("q3", "List three colors of the rainbow."),
]
REF_MAX_TOKENS = 32
COMPLETION_PROMPT = "The three primary colors are"


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- prerequisites

def reexec_in_venv():
    """Runs this script again with the project venv's Python when `openai` is missing here."""
    try:
        import openai  # noqa: F401
        return
    except ImportError:
        pass
    # (A venv's python is a symlink to its base interpreter: compare prefixes, not binaries.)
    if VENV_PYTHON.exists() and Path(sys.prefix).resolve() != VENV_PYTHON.parent.parent.resolve() \
            and not os.environ.get("TRELLIS_SERVE_TEST_REEXEC"):
        os.environ["TRELLIS_SERVE_TEST_REEXEC"] = "1"
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), str(Path(__file__).resolve()), *sys.argv[1:]])


def model_path(given):
    if given:
        return given
    p = os.environ.get("TRELLIS_SMOLLM2_GGUF", "")
    env = CACHE / "models.env"
    if not p and env.is_file():
        for line in env.read_text().splitlines():
            if line.startswith("TRELLIS_SMOLLM2_GGUF="):
                p = line.split("=", 1)[1].strip()
    return p


def check_prerequisites(args):
    """Returns a list of what is missing (peers/model), after failing hard on bad arguments."""
    trellis = Path(args.trellis)
    if not (trellis.is_file() and os.access(trellis, os.X_OK)):
        raise SystemExit(f"openai_client_test: --trellis {args.trellis}: not an executable file (build it first)")
    if args.np != args.pp * args.tp:
        raise SystemExit(f"openai_client_test: --np {args.np} must equal --pp {args.pp} x --tp {args.tp}")
    missing = []
    try:
        import openai  # noqa: F401
    except ImportError:
        missing.append(f"the openai package (not in {sys.executable}; scripts/setup-peers makes {VENV_PYTHON})")
    if subprocess.run(["sh", "-c", "command -v curl"], capture_output=True).returncode != 0:
        missing.append("curl")
    if args.np > 1 and not Path(args.mpirun).is_file():
        missing.append(f"the mpirun launcher {args.mpirun}")
    if not args.model or not Path(args.model).is_file():
        missing.append(f"the model ({args.model or 'TRELLIS_SMOLLM2_GGUF unset'}; run scripts/setup-models)")
    return missing


# ---------------------------------------------------------------- reference token counts

class PeerTokenizer:
    """llama.cpp's tokenizer (llama-cpp-python, vocab only) and the GGUF's own chat template
    rendered with Jinja2: the prompt token counts a server should report."""

    def __init__(self, gguf):
        import jinja2.sandbox
        import llama_cpp
        # llama.cpp prints a context warning for a vocabulary-only load on fd 2: hide it.
        saved = os.dup(2)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 2)
                self.llm = llama_cpp.Llama(model_path=gguf, vocab_only=True, verbose=False)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        meta = self.llm.metadata
        self.template = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True).from_string(meta["tokenizer.chat_template"])
        self.bos = self.llm.detokenize([self.llm.token_bos()], special=True).decode("utf-8", "replace")
        self.eos = self.llm.detokenize([self.llm.token_eos()], special=True).decode("utf-8", "replace")

    def count(self, text):
        # add_bos=True adds BOS only when the model asks for it (tokenizer.ggml.add_bos_token)
        return len(self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def count_chat(self, messages):
        text = self.template.render(messages=messages, add_generation_prompt=True,
                                    bos_token=self.bos, eos_token=self.eos)
        return len(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))


# ---------------------------------------------------------------- the server process

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_cmd(args, command):
    """`trellis COMMAND --model M` (one rank) or under mpirun-local with NP ranks and the layout."""
    sets = [x for kv in args.set for x in ("--set", kv)]
    base = [str(Path(args.trellis).resolve()), *sets, command, "--model", args.model]
    if args.np == 1:
        return base
    return [args.mpirun, "-np", str(args.np), *base, "--pp", str(args.pp), "--tp", str(args.tp)]


def children(pid):
    """Direct children of pid (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(d.name))
    return out


def alive(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError):
        return False


class Server:
    def __init__(self, args, port, logdir, env_extra=None, flags=()):
        self.args = args
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = Path(logdir) / f"serve-{port}.log"
        cmd = launch_cmd(args, "serve") + ["--port", str(port), *flags, *args.serve_flag]
        env = dict(os.environ, **(env_extra or {}))
        log(f"starting: {' '.join(cmd)}")
        self.logf = open(self.log_path, "w")
        # Own session: the cleanup can signal everything the launcher started.
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.ranks = []

    def log_tail(self, n=40):
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join("    | " + l for l in lines[-n:])

    def wait_healthy(self, timeout):
        import urllib.error
        import urllib.request
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode} before /health "
                                   f"answered 200; its log:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.ranks = self.find_ranks()
                        return True
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.25)
        raise RuntimeError(f"/health did not answer 200 within {timeout:.0f} s (last: {last}); "
                           f"the server's log:\n{self.log_tail()}")

    def find_ranks(self):
        """The trellis processes: the launched one, or mpirun's children."""
        if self.args.np == 1:
            return [self.proc.pid]
        ranks = [p for p in children(self.proc.pid) if "trellis" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
        return ranks

    def sigterm(self, to):
        """SIGTERM to every rank (as systemd or `kill` of the job's processes does), or SIGUSR1
        to the launcher only: mpirun turns SIGTERM into a job kill about a second later, but
        passes SIGUSR1 on as it is, so that is the graceful stop docs/serve.md gives."""
        sig = signal.SIGTERM if to == "ranks" else signal.SIGUSR1
        for pid in self.ranks if to == "ranks" else [self.proc.pid]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self):
        """Last resort (finally): SIGKILL the launcher's session and any rank still alive."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in self.ranks:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.logf.close()


# ---------------------------------------------------------------- checks

class Failure(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Failure(msg)


class Tester:
    def __init__(self, args):
        self.args = args
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.failures = []

    def check(self, name, fn, *a):
        t0 = time.monotonic()
        try:
            result = fn(*a)
        except Failure as e:
            self.failed += 1
            self.failures.append(name)
            log(f"FAIL {name}: {e}")
            return None
        except Exception as e:  # an unexpected exception is a failed check, with its trace
            self.failed += 1
            self.failures.append(name)
            log(f"FAIL {name}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3, file=sys.stdout)
            return None
        if result == "skip":
            self.skipped += 1
            return None
        self.passed += 1
        log(f"ok   {name} ({time.monotonic() - t0:.1f} s)")
        return result

    def skip(self, name, why):
        if os.environ.get("TRELLIS_REQUIRE_PEERS") == "1":
            self.failed += 1
            self.failures.append(name)
            log(f"FAIL {name}: {why} (TRELLIS_REQUIRE_PEERS=1)")
        else:
            self.skipped += 1
            log(f"skip {name}: {why}")


def usage_of(resp):
    u = resp.usage
    expect(u is not None, "the response has no usage")
    expect(isinstance(u.prompt_tokens, int) and u.prompt_tokens > 0, f"usage.prompt_tokens {u.prompt_tokens!r}")
    expect(isinstance(u.completion_tokens, int) and u.completion_tokens >= 0,
           f"usage.completion_tokens {u.completion_tokens!r}")
    expect(u.total_tokens == u.prompt_tokens + u.completion_tokens,
           f"usage.total_tokens {u.total_tokens} != {u.prompt_tokens} + {u.completion_tokens}")
    return (u.prompt_tokens, u.completion_tokens)


def check_length_rule(finish, completion_tokens, max_tokens):
    """finish_reason is 'length' exactly when the output hit max_tokens (or 'stop' earlier)."""
    expect(finish in ("stop", "length"), f"finish_reason {finish!r}")
    if finish == "length":
        expect(completion_tokens == max_tokens,
               f"finish_reason 'length' with completion_tokens {completion_tokens} != max_tokens {max_tokens}")
    else:
        expect(completion_tokens <= max_tokens, f"completion_tokens {completion_tokens} > max_tokens {max_tokens}")


class Suite:
    """The checks against one running server. `ref` maps prompt id -> `trellis run` text."""

    def __init__(self, args, server, ref, peer):
        import openai
        self.openai = openai
        self.args = args
        self.server = server
        self.ref = ref
        self.peer = peer
        self.model = args.model_name
        self.client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                                    timeout=args.request_timeout)
        self.greedy = {}  # "completion" | "chat" -> (text, finish_reason, usage) of the greedy non-stream call

    # --- helpers
    def chat(self, content, **kw):
        kw.setdefault("temperature", 0)
        return self.client.chat.completions.create(model=self.model,
                                                   messages=[{"role": "user", "content": content}], **kw)

    def complete(self, prompt, **kw):
        kw.setdefault("temperature", 0)
        return self.client.completions.create(model=self.model, prompt=prompt, **kw)

    def chat_stream(self, content, **kw):
        """(text, last finish_reason, usage or None, chunks) of a streamed chat call."""
        kw.setdefault("temperature", 0)
        stream = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": content}], stream=True,
            stream_options={"include_usage": True}, **kw)
        return self._collect(stream, chat=True)

    def complete_stream(self, prompt, **kw):
        kw.setdefault("temperature", 0)
        stream = self.client.completions.create(model=self.model, prompt=prompt, stream=True,
                                                stream_options={"include_usage": True}, **kw)
        return self._collect(stream, chat=False)

    def _collect(self, stream, chat):
        text, finish, usage, chunks, ids = "", None, None, 0, set()
        after_usage = False
        for ch in stream:
            chunks += 1
            ids.add(ch.id)
            expect(ch.object == ("chat.completion.chunk" if chat else "text_completion"),
                   f"chunk object {ch.object!r}")
            expect(not after_usage, "a chunk came after the usage chunk")
            if ch.usage is not None:
                expect(not ch.choices, "the usage chunk has choices")
                usage = (ch.usage.prompt_tokens, ch.usage.completion_tokens)
                expect(ch.usage.total_tokens == usage[0] + usage[1], "stream usage total != prompt + completion")
                after_usage = True
                continue
            for c in ch.choices:
                expect(finish is None, "a chunk came after the one with finish_reason")
                piece = (c.delta.content if chat else c.text) or ""
                text += piece
                if c.finish_reason:
                    finish = c.finish_reason
        expect(len(ids) == 1, f"chunks of one stream carry {len(ids)} different ids")
        expect(finish is not None, "no chunk carried a finish_reason")
        expect(usage is not None, "stream_options.include_usage: no usage chunk before [DONE]")
        return text, finish, usage, chunks

    def curl(self, *extra, body=None, path="/v1/chat/completions", key=API_KEY, timeout=60):
        """(http status, headers text, body text) of a raw curl call."""
        cmd = ["curl", "-sS", "-N", "-D", "-", "-o", "-", "--max-time", str(timeout),
               "-H", "Content-Type: application/json"]
        if key:
            cmd += ["-H", f"Authorization: Bearer {key}"]
        if body is not None:
            cmd += ["--data-binary", "@-"]
        cmd += [*extra, self.server.url + path]
        r = subprocess.run(cmd, input=body.encode() if isinstance(body, str) else body,
                           capture_output=True, timeout=timeout + 10)
        out = r.stdout.decode("utf-8", "replace")
        head, _, rest = out.partition("\r\n\r\n")
        while head.startswith("HTTP/1.1 100"):  # Expect: 100-continue
            head, _, rest = rest.partition("\r\n\r\n")
        m = re.match(r"HTTP/[\d.]+ (\d+)", head)
        expect(m is not None, f"curl got no HTTP response (exit {r.returncode}: {r.stderr.decode()[:200]})")
        return int(m.group(1)), head, rest

    def error_object(self, status_wanted, status, body, what):
        expect(status == status_wanted, f"{what}: HTTP {status}, wanted {status_wanted}: {body[:200]}")
        try:
            err = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            raise Failure(f"{what}: the body is not an OpenAI error object: {body[:200]}") from None
        expect(isinstance(err.get("message"), str) and err["message"], f"{what}: error.message missing")
        expect(isinstance(err.get("type"), str), f"{what}: error.type missing")
        return err

    # --- the checks
    def models(self):
        ids = [m.id for m in self.client.models.list().data]
        expect(ids == [self.model], f"/v1/models lists {ids}, wanted [{self.model!r}]")
        m = self.client.models.retrieve(self.model)
        expect(m.id == self.model, f"/v1/models/{self.model} says {m.id!r}")

    def health_and_metrics(self):
        status, _, body = self.curl(path="/health", key=None)
        expect(status == 200, f"/health without a key: HTTP {status}")
        status, head, body = self.curl(path="/metrics")
        expect(status == 200, f"/metrics: HTTP {status}")
        samples = [l for l in body.splitlines() if l and not l.startswith("#")]
        expect(samples, "/metrics has no samples")
        bad = [l for l in samples if not re.match(
            r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? [-+]?([0-9.]+([eE][-+]?[0-9]+)?|NaN|Inf)( \d+)?$", l)]
        expect(not bad, f"/metrics lines that are not Prometheus samples: {bad[:3]}")

    def swift_metrics(self):
        """Under --swift: /metrics shows that requests were drafted and verified."""
        status, _, body = self.curl(path="/metrics")
        expect(status == 200, f"/metrics: HTTP {status}")
        vals = {m.group(1): float(m.group(2)) for m in re.finditer(r"^trellis_(swift_\w+) ([0-9.eE+-]+)$", body, re.M)}
        for name in ("swift_verify_passes_total", "swift_draft_tokens_total", "swift_accepted_tokens_total"):
            expect(vals.get(name, 0) > 0, f"/metrics {name} = {vals.get(name)}: SWIFT did not draft")
        log(f"     swift: {int(vals['swift_draft_tokens_total'])} drafts, {int(vals['swift_accepted_tokens_total'])} "
            f"accepted, {int(vals['swift_verify_passes_total'])} verify passes")

    def completion_nonstream(self):
        r = self.complete(COMPLETION_PROMPT, max_tokens=24)
        expect(r.object == "text_completion", f"object {r.object!r}")
        expect(len(r.choices) == 1, f"{len(r.choices)} choices")
        text, finish = r.choices[0].text, r.choices[0].finish_reason
        expect(text, "empty completion text")
        usage = usage_of(r)
        check_length_rule(finish, usage[1], 24)
        self.greedy["completion"] = (text, finish, usage)
        log(f"     completion: {text!r} ({finish}, usage {usage})")

    def completion_stream(self):
        expect("completion" in self.greedy, "needs the non-stream completion")
        text, finish, usage, chunks = self.complete_stream(COMPLETION_PROMPT, max_tokens=24)
        want = self.greedy["completion"]
        expect(text == want[0], f"streamed text {text!r} != non-stream {want[0]!r}")
        expect(finish == want[1], f"streamed finish_reason {finish!r} != {want[1]!r}")
        expect(usage == want[2], f"stream usage {usage} != non-stream usage {want[2]}")
        expect(chunks >= 2, f"only {chunks} chunks")

    def chat_nonstream(self):
        r = self.chat(CHAT_PROMPTS[0][1], max_tokens=REF_MAX_TOKENS)
        expect(r.object == "chat.completion", f"object {r.object!r}")
        msg = r.choices[0].message
        expect(msg.role == "assistant", f"role {msg.role!r}")
        expect(msg.content, "empty chat content")
        usage = usage_of(r)
        check_length_rule(r.choices[0].finish_reason, usage[1], REF_MAX_TOKENS)
        self.greedy["chat"] = (msg.content, r.choices[0].finish_reason, usage)
        log(f"     chat: {msg.content!r} ({r.choices[0].finish_reason}, usage {usage})")

    def chat_stream_check(self):
        expect("chat" in self.greedy, "needs the non-stream chat")
        text, finish, usage, chunks = self.chat_stream(CHAT_PROMPTS[0][1], max_tokens=REF_MAX_TOKENS)
        want = self.greedy["chat"]
        expect(text == want[0], f"streamed text {text!r} != non-stream {want[0]!r}")
        expect(finish == want[1], f"streamed finish_reason {finish!r} != {want[1]!r}")
        expect(usage == want[2], f"stream usage {usage} != non-stream usage {want[2]}")

    def sse_raw(self):
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "Say hello."}],
                           "max_tokens": 8, "temperature": 0, "stream": True})
        status, head, rest = self.curl(body=body)
        expect(status == 200, f"HTTP {status}: {rest[:200]}")
        expect(re.search(r"(?im)^content-type:\s*text/event-stream", head), f"no text/event-stream header:\n{head}")
        events = [e for e in rest.replace("\r\n", "\n").split("\n\n") if e.strip()]
        expect(events and events[-1].strip() == "data: [DONE]", f"the stream does not end with 'data: [DONE]': "
               f"{events[-1][:100] if events else '(empty)'!r}")
        for e in events[:-1]:
            expect(e.startswith("data: "), f"event without 'data: ': {e[:100]!r}")
            json.loads(e[len("data: "):])
        expect(rest.count("[DONE]") == 1, "more than one [DONE]")

    def stop_strings(self):
        base, _, _ = self.greedy["chat"]
        # A stop string from the middle of the greedy answer: the first word after 8 characters.
        m = re.search(r"\s(\w{3,})", base[8:])
        expect(m is not None, f"the greedy answer {base!r} has no word to stop at")
        stop = m.group(1)[:4]
        want = base[:base.index(stop)]
        r = self.chat(CHAT_PROMPTS[0][1], max_tokens=REF_MAX_TOKENS, stop=[stop, "\u2603never"])
        got, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
        expect(got == want, f"stop {stop!r}: text {got!r}, wanted {want!r}")
        expect(finish == "stop", f"stop {stop!r}: finish_reason {finish!r}")
        text, finish, _, _ = self.chat_stream(CHAT_PROMPTS[0][1], max_tokens=REF_MAX_TOKENS, stop=stop)
        expect(text == want, f"stream, stop {stop!r}: text {text!r}, wanted {want!r}")
        expect(finish == "stop", f"stream, stop {stop!r}: finish_reason {finish!r}")
        # Completions too, with a stop string as a plain string.
        ctext = self.greedy["completion"][0]
        m = re.search(r"\s(\w{2,})", ctext[3:])
        if m:
            cstop = m.group(1)
            r = self.complete(COMPLETION_PROMPT, max_tokens=24, stop=cstop)
            want = ctext[:ctext.index(cstop)]
            expect(r.choices[0].text == want and r.choices[0].finish_reason == "stop",
                   f"completion stop {cstop!r}: {r.choices[0].text!r} ({r.choices[0].finish_reason}), wanted {want!r}")

    def max_tokens_length(self):
        for endpoint, call in (("chat", lambda: self.chat("Write a long story about a dragon.", max_tokens=5)),
                               ("completion", lambda: self.complete("Once upon a time", max_tokens=5))):
            r = call()
            p, c = usage_of(r)
            expect(r.choices[0].finish_reason == "length", f"{endpoint}: finish_reason {r.choices[0].finish_reason!r}")
            expect(c == 5, f"{endpoint}: completion_tokens {c}, wanted 5")
        # Stream too: 'length' on the last chunk, 5 tokens in the usage chunk.
        _, finish, usage, _ = self.chat_stream("Write a long story about a dragon.", max_tokens=5)
        expect(finish == "length" and usage[1] == 5, f"stream: finish_reason {finish!r}, usage {usage}")

    def usage_counts(self):
        if self.peer is None:
            return "skip"
        want = self.peer.count(COMPLETION_PROMPT)
        got = self.greedy["completion"][2][0]
        expect(got == want, f"completion prompt_tokens {got}, llama.cpp counts {want}")
        msgs = [{"role": "user", "content": CHAT_PROMPTS[0][1]}]
        want = self.peer.count_chat(msgs)
        got = self.greedy["chat"][2][0]
        expect(got == want, f"chat prompt_tokens {got}, llama.cpp counts {want} for the model's chat template")
        # A system message and a multi-turn conversation.
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a fruit."}]
        r = self.client.chat.completions.create(model=self.model, messages=msgs, max_tokens=2, temperature=0)
        got, want = usage_of(r)[0], self.peer.count_chat(msgs)
        expect(got == want, f"multi-turn chat prompt_tokens {got}, llama.cpp counts {want}")

    def errors(self):
        o = self.openai
        long_prompt = " hello" * 3000  # beyond the context (run.max_context, 512 by default)
        cases = [
            ("n=2", o.BadRequestError, lambda: self.chat("Hi", max_tokens=4, n=2)),
            ("temperature -1", o.BadRequestError, lambda: self.chat("Hi", max_tokens=4, temperature=-1)),
            ("max_tokens 0", o.BadRequestError, lambda: self.chat("Hi", max_tokens=0)),
            ("prompt longer than the context", o.BadRequestError, lambda: self.complete(long_prompt, max_tokens=4)),
            ("chat longer than the context", o.BadRequestError, lambda: self.chat(long_prompt, max_tokens=4)),
            ("unknown model", o.NotFoundError,
             lambda: self.client.chat.completions.create(model="no-such-model", max_tokens=4,
                                                         messages=[{"role": "user", "content": "Hi"}])),
        ]
        for what, exc, call in cases:
            try:
                call()
            except exc as e:
                body = e.body if isinstance(e.body, dict) else {}
                expect(isinstance(body.get("message"), str) and body["message"],
                       f"{what}: {exc.__name__} without an error message ({e.body!r})")
                continue
            except o.APIStatusError as e:
                raise Failure(f"{what}: HTTP {e.status_code} ({type(e).__name__}), wanted {exc.__name__}: "
                              f"{e.body!r}") from None
            raise Failure(f"{what}: the request succeeded, wanted {exc.__name__}")
        # Raw errors: bad JSON, missing messages, unknown route.
        self.error_object(400, *self.curl(body="{not json")[::2], "malformed JSON")
        self.error_object(400, *self.curl(body=json.dumps({"model": self.model}))[::2], "no messages")
        status, _, _ = self.curl(path="/v1/no-such-route", body="{}")
        expect(status == 404, f"unknown route: HTTP {status}")

    def auth(self):
        o = self.openai
        bad = o.OpenAI(base_url=self.server.url + "/v1", api_key="wrong-key", max_retries=0, timeout=30)
        try:
            bad.models.list()
            raise Failure("a wrong API key was accepted")
        except o.AuthenticationError:
            pass
        try:
            bad.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            raise Failure("a wrong API key was accepted for chat")
        except o.AuthenticationError:
            pass
        status, _, body = self.curl(key=None, body=json.dumps(
            {"model": self.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}))
        self.error_object(401, status, body, "no Authorization header")

    def body_limit(self):
        body = json.dumps({"model": self.model, "prompt": "x" * (4 << 20), "max_tokens": 1})
        status, _, rest = self.curl(body=body, path="/v1/completions")
        self.error_object(413, status, rest, "a 4 MiB body")
        # The server still answers afterwards.
        expect(self.chat("Hi", max_tokens=2).choices, "no answer after the 413")

    def equals_trellis_run(self):
        if not self.ref:
            raise Failure("no `trellis run` reference (see above)")
        for pid, prompt in CHAT_PROMPTS:
            r = self.chat(prompt, max_tokens=REF_MAX_TOKENS)
            got = r.choices[0].message.content
            expect(got == self.ref[pid]["text"],
                   f"{pid}: server {got!r} != trellis run {self.ref[pid]['text']!r}")
            n = len(self.ref[pid]["tokens"])
            c = r.usage.completion_tokens
            expect(c in (n, n - 1), f"{pid}: completion_tokens {c}, trellis run generated {n} tokens")

    def concurrent(self):
        """The reference prompts at once (continuous batching): same greedy texts."""
        if not self.ref:
            raise Failure("no `trellis run` reference")
        results, errors = [], []

        def one(pid, prompt):
            try:
                results.append((pid, self.chat_stream(prompt, max_tokens=REF_MAX_TOKENS)[0]))
            except Exception as e:
                errors.append(f"{pid}: {type(e).__name__}: {e}")
        threads = [threading.Thread(target=one, args=p) for p in CHAT_PROMPTS * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.args.request_timeout)
        expect(not errors, "; ".join(errors))
        expect(len(results) == len(threads), f"{len(threads) - len(results)} requests did not finish")
        for pid, text in results:
            expect(text == self.ref[pid]["text"], f"{pid} concurrent: {text!r} != {self.ref[pid]['text']!r}")

    def seeded(self):
        kw = dict(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234)
        a = self.chat("Tell me a fun fact.", **kw).choices[0].message.content
        b = self.chat("Tell me a fun fact.", **kw).choices[0].message.content
        expect(a == b, f"the same seed gave {a!r} and {b!r}")

    def metrics(self):
        """/metrics samples as {name{labels}: value}."""
        _, _, body = self.curl(path="/metrics")
        out = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out

    def disconnect_mid_stream(self):
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "Write a long story."}],
                           "max_tokens": 200, "temperature": 0, "stream": True}).encode()
        tokens = "trellis_generation_tokens_total"
        before = self.metrics().get(tokens)
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", self.server.port), timeout=30)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            got = b""
            deadline = time.monotonic() + 60
            while got.count(b"data: ") < 2 and time.monotonic() < deadline:
                part = s.recv(4096)
                if not part:
                    break
                got += part
            expect(got.count(b"data: ") >= 2, f"no stream chunks before disconnecting: {got[:200]!r}")
            s.close()
        # The server stops generating for them (they would make 3 x 200 tokens otherwise).
        if before is not None:
            deadline, last, stable_since = time.monotonic() + 20, None, time.monotonic()
            while time.monotonic() < deadline:
                now = self.metrics().get(tokens, 0)
                if now != last:
                    last, stable_since = now, time.monotonic()
                elif time.monotonic() - stable_since > 1.0:
                    break
                time.sleep(0.1)
            extra = last - before
            log(f"     3 disconnected streams generated {extra:.0f} tokens in all (max_tokens 200 each)")
            expect(extra < 300, f"the disconnected streams generated {extra:.0f} tokens: the server did not "
                                "stop generating for clients that went away")
        else:
            log(f"     /metrics has no {tokens}: not checking that generation stops")
        # The next requests work and give the same greedy answer as before.
        text = self.chat(CHAT_PROMPTS[0][1], max_tokens=REF_MAX_TOKENS).choices[0].message.content
        expect(text == self.greedy["chat"][0], f"after disconnects: {text!r} != {self.greedy['chat'][0]!r}")
        text, _, _, _ = self.chat_stream(CHAT_PROMPTS[0][1], max_tokens=REF_MAX_TOKENS)
        expect(text == self.greedy["chat"][0], f"stream after disconnects: {text!r}")

    def sigterm_drains(self):
        """SIGTERM to every rank while a stream runs: it finishes, then every process exits 0."""
        srv = self.server
        expect(srv.ranks, "the rank processes were not found")
        result = {}
        first_chunk = threading.Event()

        def stream():
            try:
                chunks = self.client.chat.completions.create(
                    model=self.model, messages=[{"role": "user", "content": "Write a long story about a dragon."}],
                    max_tokens=48, temperature=0, stream=True)
                finish = None
                for ch in chunks:
                    first_chunk.set()
                    for c in ch.choices:
                        finish = c.finish_reason or finish
                result["finish"] = finish
            except Exception as e:
                result["error"] = f"{type(e).__name__}: {e}"
            finally:
                first_chunk.set()
        t = threading.Thread(target=stream)
        t.start()
        expect(first_chunk.wait(self.args.request_timeout), "no stream chunk before SIGTERM")
        srv.sigterm(self.args.signal_to)
        t.join(self.args.request_timeout)
        try:
            rc = srv.proc.wait(timeout=self.args.exit_timeout)
        except subprocess.TimeoutExpired:
            raise Failure(f"the server did not exit within {self.args.exit_timeout} s of SIGTERM; "
                          f"its log:\n{srv.log_tail()}") from None
        stragglers = [p for p in srv.ranks if alive(p)]
        expect(not stragglers, f"ranks {stragglers} still run after the launcher exited")
        expect(rc == 0, f"exit status {rc} after SIGTERM; the log:\n{srv.log_tail()}")
        expect("error" not in result, f"the in-flight stream failed during the drain: {result.get('error')}")
        expect(result.get("finish") in ("stop", "length"),
               f"the in-flight stream ended without a finish_reason: {result}")


# ---------------------------------------------------------------- trellis run reference

def trellis_run_reference(args, workdir):
    """Greedy answers of `trellis run --chat` with the same layout: {id: {"text", "tokens"}}."""
    prompts = Path(workdir) / "ref-prompts.jsonl"
    out = Path(workdir) / "ref-out.jsonl"
    with prompts.open("w") as f:
        for pid, text in CHAT_PROMPTS:
            f.write(json.dumps({"id": pid, "text": text,
                                "sampling": {"greedy": True, "max_tokens": REF_MAX_TOKENS}}) + "\n")
    cmd = launch_cmd(args, "run") + ["--chat", "--prompts", str(prompts), "--out", str(out)]
    log(f"reference: {' '.join(cmd)}")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.start_timeout,
                           start_new_session=True)
    except subprocess.TimeoutExpired:
        raise Failure(f"`trellis run` did not finish within {args.start_timeout} s") from None
    expect(r.returncode == 0, f"`trellis run` exited {r.returncode}:\n{(r.stdout + r.stderr)[-2000:]}")
    ref = {}
    for line in out.read_text().splitlines():
        j = json.loads(line)
        expect(j.get("status") == "ok", f"`trellis run` request {j.get('id')}: {j.get('reason')}")
        ref[j["id"]] = j
    expect(set(ref) == {p for p, _ in CHAT_PROMPTS}, f"`trellis run` answered {sorted(ref)}")
    return ref


# ---------------------------------------------------------------- main

def main():
    reexec_in_venv()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trellis", required=True, help="path of the trellis binary")
    ap.add_argument("--np", type=int, default=1, help="ranks (1: no mpirun)")
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--model", default="", help="GGUF (default $TRELLIS_SMOLLM2_GGUF or models.env)")
    ap.add_argument("--mpirun", default=str(REPO / "scripts" / "mpirun-local"), help="mpirun wrapper for --np > 1")
    ap.add_argument("--start-timeout", type=float, default=150, help="seconds for load until /health is 200")
    ap.add_argument("--request-timeout", type=float, default=60, help="seconds per request")
    ap.add_argument("--exit-timeout", type=float, default=45, help="seconds from SIGTERM to exit")
    ap.add_argument("--signal-to", choices=("ranks", "launcher"), default="ranks",
                    help="the stop check: SIGTERM to every rank (default), or SIGUSR1 to the launcher only "
                         "(mpirun with --np > 1: its graceful stop)")
    ap.add_argument("--set", action="append", default=[], metavar="K=V",
                    help="a setting for every trellis command (the reference run and the server)")
    ap.add_argument("--serve-flag", action="append", default=[], metavar="FLAG",
                    help="an extra flag for `trellis serve` only (e.g. --swift)")
    args = ap.parse_args()
    for name in ("np", "pp", "tp"):
        if getattr(args, name) < 1:
            raise SystemExit(f"openai_client_test: --{name} must be >= 1")
    args.model = model_path(args.model)

    missing = check_prerequisites(args)
    if missing:
        what = "; ".join(missing)
        if os.environ.get("TRELLIS_REQUIRE_PEERS") == "1":
            log(f"FAIL prerequisites missing (TRELLIS_REQUIRE_PEERS=1): {what}")
            log("0 passed, 1 failed")
            return 1
        log(f"skipped: missing {what}")
        return SKIP
    args.model_name = Path(args.model).stem
    layout = f"np {args.np}" + (f" (pp {args.pp} x tp {args.tp})" if args.np > 1 else "")
    log(f"trellis serve, {layout}, model {args.model}")

    peer = None
    try:
        peer = PeerTokenizer(args.model)
    except ImportError as e:
        peer_why = f"llama-cpp-python/jinja2 not installed ({e})"
    except Exception as e:
        peer_why = f"llama.cpp could not load the tokenizer: {e}"

    t = Tester(args)
    workdir = tempfile.mkdtemp(prefix="trellis-serve-test-")
    ref = t.check("trellis run reference (greedy, same layout)", trellis_run_reference, args, workdir)
    server = None
    try:
        # The key by flag on one rank, by environment variable under mpirun: both ways are covered.
        if args.np == 1:
            server = Server(args, free_port(), workdir, flags=("--api-key", API_KEY))
        else:
            server = Server(args, free_port(), workdir, env_extra={"TRELLIS_API_KEY": API_KEY})
        if not t.check("server starts and /health answers 200", server.wait_healthy, args.start_timeout):
            raise Failure("the server did not start")
        s = Suite(args, server, ref, peer)
        t.check("GET /v1/models", s.models)
        t.check("/health open, /metrics Prometheus text", s.health_and_metrics)
        t.check("completion, greedy", s.completion_nonstream)
        t.check("completion stream == non-stream", s.completion_stream)
        t.check("chat, greedy", s.chat_nonstream)
        t.check("chat stream == non-stream", s.chat_stream_check)
        t.check("raw SSE (curl -N) ends with data: [DONE]", s.sse_raw)
        t.check("stop strings", s.stop_strings)
        t.check("max_tokens -> finish_reason length", s.max_tokens_length)
        if peer is not None:
            t.check("prompt_tokens == llama.cpp tokenizer", s.usage_counts)
        else:
            t.skip("prompt_tokens == llama.cpp tokenizer", peer_why)
        t.check("errors: 400/404 as OpenAI error objects", s.errors)
        t.check("API key: wrong or missing -> 401", s.auth)
        t.check("413 for a body over serve.max_body_bytes", s.body_limit)
        t.check("greedy chat == trellis run", s.equals_trellis_run)
        t.check("concurrent greedy streams == trellis run", s.concurrent)
        if "--swift" in args.serve_flag:
            t.check("SWIFT drafted and verified (/metrics)", s.swift_metrics)
        if "--swift" in args.serve_flag:
            # Not run: with SWIFT a seed fixes the draws, but the draft distributions depend on
            # the skip set, which the run's optimiser keeps changing; the text's distribution
            # is plain sampling's (tests/runtime/swift_layouts.sh), not its exact value.
            log("note: 'same seed, same sampled text' does not apply under --swift (docs/swift.md)")
        else:
            t.check("same seed, same sampled text", s.seeded)
        t.check("client disconnecting mid-stream", s.disconnect_mid_stream)
        t.check(f"{'SIGTERM to every rank' if args.signal_to == 'ranks' else 'SIGUSR1 to mpirun'}: drains, "
                "every rank exits 0", s.sigterm_drains)
    except Failure as e:
        log(f"stopped: {e}")
    finally:
        if server is not None:
            server.kill()
        if t.failed:
            log(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    log(f"{t.passed} passed, {t.failed} failed" + (f", {t.skipped} skipped" if t.skipped else ""))
    if t.failed:
        log("failed: " + "; ".join(t.failures))
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())

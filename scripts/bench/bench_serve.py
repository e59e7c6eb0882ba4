#!/usr/bin/env python3
"""Serving load benchmark for any OpenAI-compatible server (trellis serve, llama.cpp, vLLM).

Like vLLM's benchmark_serving: requests arrive as a Poisson process at --request-rate
(or all at once with inf), each streamed over /v1/chat/completions (or /v1/completions),
and the run reports throughput, time to first token (TTFT), time per output token after
the first (TPOT), inter-token latency (ITL) and, with --goodput, the requests per second
that met every SLO. The result block has vLLM's layout; --save-result writes it as JSON.

  scripts/bench-serve --base-url http://127.0.0.1:8000 --num-prompts 50 --request-rate 2 \\
      --max-tokens 64 --goodput ttft:500 tpot:50 --save-result out/serve.json

Measurements, per request:
  TTFT   from sending the request to the first streamed chunk that carries text (the
         whole latency for an answer without text);
  ITL    the gaps between successive text-carrying chunks;
  TPOT   (latency - TTFT) / (output tokens - 1);
  failed a stream that is not HTTP 200, carries an error, or ends without a finish_reason
         or without 'data: [DONE]';
  tokens from the usage the server streams (stream_options.include_usage); a server that
         sends none is counted one token per text chunk (output) and, after the timed run,
         asked once per distinct prompt with max_tokens=1 for its prompt_tokens (input).
         The JSON result says which source was used ("token_source").

Needs httpx or httpx2 (what the `openai` package depends on; the project venv has it).
Exit status: 0 when at least one request succeeded, 1 otherwise or on a bad argument/input.
"""
import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DATASET = Path(__file__).resolve().parent / "serve_prompts.jsonl"

try:  # the HTTP client `openai` depends on: httpx, or httpx2 (its renamed successor) in newer releases
    import httpx
except ImportError:
    try:
        import httpx2 as httpx
    except ImportError:
        httpx = None

GOODPUT_KEYS = ("ttft", "tpot", "e2el")


class InputError(Exception):
    """A bad argument or input file: printed as one line, exit status 1."""


# ---------------------------------------------------------------- inputs

def load_dataset(path):
    """Prompts from a JSONL file: one object per line with "text" or "prompt" (a string) or
    "messages" (a list of {"role", "content"}); the trellis prompts format fits. Blank lines
    and lines starting with '#' are skipped. Returns a list of {"id", "messages", "text"}."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"dataset {path}: no such file")
    prompts = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            where = f"dataset {path} line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{where}: expected a JSON object")
            text = obj.get("text", obj.get("prompt"))
            messages = obj.get("messages")
            if messages is not None:
                if (not isinstance(messages, list) or not messages or not all(
                        isinstance(m, dict) and isinstance(m.get("role"), str)
                        and isinstance(m.get("content"), str) for m in messages)):
                    raise InputError(f"{where}: \"messages\" must be a non-empty list of "
                                     "{\"role\": str, \"content\": str}")
                text = "\n".join(m["content"] for m in messages)
            elif isinstance(text, str) and text:
                messages = [{"role": "user", "content": text}]
            else:
                raise InputError(f"{where}: needs a non-empty \"text\" or \"prompt\" string "
                                 "or a \"messages\" list")
            prompts.append({"id": str(obj.get("id", f"line{n}")), "messages": messages, "text": text})
    if not prompts:
        raise InputError(f"dataset {path}: no prompts")
    return prompts


def parse_rate(s):
    if s.lower() in ("inf", "infinity"):
        return math.inf
    try:
        r = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or 'inf': {s!r}") from None
    if not (r > 0 and math.isfinite(r)):
        raise argparse.ArgumentTypeError(f"must be > 0 (or 'inf'): {s!r}")
    return r


def parse_goodput(items):
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos = {}
    for item in items or []:
        key, sep, value = item.partition(":")
        if not sep or key not in GOODPUT_KEYS:
            raise InputError(f"--goodput {item!r}: expected KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}")
        try:
            ms = float(value)
        except ValueError:
            raise InputError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
        if not ms > 0:
            raise InputError(f"--goodput {item!r}: the SLO must be > 0 ms")
        slos[key] = ms
    return slos


def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {s!r}")
    return v


# ---------------------------------------------------------------- one request

@dataclass
class Result:
    prompt_id: str
    success: bool = False
    error: str = ""
    ttft: float = 0.0            # seconds
    latency: float = 0.0         # seconds, send to last byte
    itl: list = field(default_factory=list)
    text: str = ""
    chunks: int = 0              # text-carrying chunks
    prompt_tokens: int = None    # from usage, else filled by the probe
    output_tokens: int = None    # from usage, else = chunks
    usage_seen: bool = False
    finish_reason: str = None


def chunk_text(endpoint, choice):
    if endpoint == "chat":
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def request_body(args, prompt, stream, max_tokens):
    body = {"model": args.model, "max_tokens": max_tokens, "temperature": args.temperature,
            "stream": stream}
    if args.endpoint == "chat":
        body["messages"] = prompt["messages"]
    else:
        body["prompt"] = prompt["text"]
    if args.top_p is not None:
        body["top_p"] = args.top_p
    if args.seed is not None:
        body["seed"] = args.seed
    if stream:
        body["stream_options"] = {"include_usage": True}
    if args.ignore_eos:
        body["ignore_eos"] = True
    body.update(args.extra_body)
    return body


async def send(client, args, prompt):
    """Streams one request; never raises (failures are recorded in the Result)."""
    r = Result(prompt_id=prompt["id"])
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", args.url, json=request_body(args, prompt, True, args.max_tokens)) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                r.error = f"HTTP {resp.status_code}: {body[:300]}"
                return r
            done = False
            async for line in resp.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue  # blank separators, comments, event: lines
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                try:
                    ev = json.loads(data)
                except json.JSONDecodeError:
                    r.error = f"bad SSE data: {data[:200]}"
                    return r
                if "error" in ev:
                    r.error = f"error event: {json.dumps(ev['error'])[:300]}"
                    return r
                usage = ev.get("usage")
                if usage:
                    r.usage_seen = True
                    r.prompt_tokens = usage.get("prompt_tokens")
                    r.output_tokens = usage.get("completion_tokens")
                for choice in ev.get("choices") or []:
                    text = chunk_text(args.endpoint, choice)
                    if choice.get("finish_reason"):
                        r.finish_reason = choice["finish_reason"]
                    if not text:
                        continue
                    if r.chunks == 0:
                        r.ttft = now - start
                    else:
                        r.itl.append(now - last)
                    last = now
                    r.chunks += 1
                    r.text += text
            r.latency = time.perf_counter() - start
            if not done:
                r.error = "stream ended without 'data: [DONE]'"
                return r
    except httpx.HTTPError as e:
        r.error = f"{type(e).__name__}: {e}"
        return r
    if r.finish_reason is None:
        # e.g. llama-cpp-python's server cuts a running stream short when a new request
        # arrives, unless it runs with --interrupt_requests False
        r.error = "the stream ended without a finish_reason (interrupted by the server?)"
        return r
    if r.chunks == 0:  # finished without text (an immediate end of turn): TTFT = latency
        r.ttft = r.latency
    if r.output_tokens is None:
        r.output_tokens = r.chunks
    r.success = True
    return r


async def probe_prompt_tokens(client, args, prompt):
    """prompt_tokens of a non-streamed max_tokens=1 request, or None."""
    try:
        resp = await client.post(args.url, json=request_body(args, prompt, False, 1))
        if resp.status_code == 200:
            return (resp.json().get("usage") or {}).get("prompt_tokens")
    except (httpx.HTTPError, ValueError):
        pass
    return None


# ---------------------------------------------------------------- the run

async def run(args, prompts):
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as client:
        if not args.model:
            args.model = await first_model(client, args.base_url)
        print(f"Model: {args.model}   endpoint: {args.url}")
        print("Starting initial single prompt test run...")
        test = await send(client, args, prompts[0])
        if not test.success:
            raise InputError(f"the test request failed: {test.error}")
        print("Initial test run completed. Starting main benchmark run...")
        rate = "inf" if math.isinf(args.request_rate) else args.request_rate
        print(f"Traffic request rate: {rate}   max concurrency: {args.max_concurrency or 'unlimited'}")

        rng = random.Random(args.seed)
        order = list(range(len(prompts)))
        rng.shuffle(order)
        chosen = [prompts[order[i % len(order)]] for i in range(args.num_prompts)]
        gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

        async def limited(p):
            if gate is None:
                return await send(client, args, p)
            async with gate:
                return await send(client, args, p)

        tasks = []
        start = time.perf_counter()
        for i, p in enumerate(chosen):
            tasks.append(asyncio.create_task(limited(p)))
            if i + 1 < len(chosen) and not math.isinf(args.request_rate):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start

        missing = {r.prompt_id for r in results if r.success and r.prompt_tokens is None}
        if missing:
            by_id = {p["id"]: p for p in chosen}
            counts = {}
            for pid in sorted(missing):
                counts[pid] = await probe_prompt_tokens(client, args, by_id[pid])
            for r in results:
                if r.success and r.prompt_tokens is None:
                    r.prompt_tokens = counts.get(r.prompt_id)
    return results, duration


async def first_model(client, base_url):
    url = base_url + "/v1/models"
    try:
        resp = await client.get(url)
    except httpx.HTTPError as e:
        raise InputError(f"cannot reach {url}: {type(e).__name__}: {e}") from None
    if resp.status_code != 200:
        raise InputError(f"GET {url}: HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        data = resp.json()["data"]
        return data[0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise InputError(f"GET {url}: no model listed (give --model): {resp.text[:200]}") from None


# ---------------------------------------------------------------- statistics and report

def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default); 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(args, results, duration, slos):
    ok = [r for r in results if r.success]
    ms = lambda xs: [x * 1000.0 for x in xs]
    ttfts = ms([r.ttft for r in ok])
    tpots = ms([(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1])
    itls = ms([x for r in ok for x in r.itl])
    e2els = ms([r.latency for r in ok])
    input_tokens = sum(r.prompt_tokens or 0 for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)

    good = 0
    if slos:
        for r in ok:
            tpot = (r.latency - r.ttft) / (r.output_tokens - 1) * 1000.0 if r.output_tokens > 1 else 0.0
            got = {"ttft": r.ttft * 1000.0, "tpot": tpot, "e2el": r.latency * 1000.0}
            good += all(got[k] <= v for k, v in slos.items())

    def stats(name, xs):
        return {f"mean_{name}_ms": sum(xs) / len(xs) if xs else 0.0,
                f"median_{name}_ms": percentile(xs, 50),
                f"std_{name}_ms": statistics_std(xs),
                **{f"p{p}_{name}_ms": percentile(xs, p) for p in (90, 99)}}

    usage_all = all(r.usage_seen for r in ok)
    out = {
        "base_url": args.base_url, "endpoint": args.endpoint, "model": args.model,
        "label": args.label, "dataset": str(args.dataset), "num_prompts": args.num_prompts,
        "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
        "max_concurrency": args.max_concurrency, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "seed": args.seed,
        "completed": len(ok), "failed": len(results) - len(ok),
        "duration": duration, "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "goodput_slos_ms": slos or None,
        "request_goodput": good / duration if slos else None,
        **stats("ttft", ttfts), **stats("tpot", tpots), **stats("itl", itls), **stats("e2el", e2els),
        "token_source": "usage" if usage_all else "chunks+probe",
        "input_lens": [r.prompt_tokens for r in ok], "output_lens": [r.output_tokens for r in ok],
        "finish_reasons": [r.finish_reason for r in ok],
        "errors": [f"{r.prompt_id}: {r.error}" for r in results if not r.success],
    }
    if args.save_texts:
        out["texts"] = {r.prompt_id: r.text for r in ok}
    return out


def statistics_std(xs):
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def print_report(s):
    line = lambda k, v: print("{:<40} {:<10}".format(k, v))
    num = lambda k, v: print("{:<40} {:<10.2f}".format(k, v))
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    line("Successful requests:", s["completed"])
    if s["failed"]:
        line("Failed requests:", s["failed"])
    num("Benchmark duration (s):", s["duration"])
    line("Total input tokens:", s["total_input_tokens"])
    line("Total generated tokens:", s["total_output_tokens"])
    num("Request throughput (req/s):", s["request_throughput"])
    if s["request_goodput"] is not None:
        num("Request goodput (req/s):", s["request_goodput"])
    num("Output token throughput (tok/s):", s["output_throughput"])
    num("Total Token throughput (tok/s):", s["total_token_throughput"])
    for title, key, name in (("Time to First Token", "ttft", "TTFT"),
                             ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
                             ("Inter-token Latency", "itl", "ITL")):
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        num(f"Mean {name} (ms):", s[f"mean_{key}_ms"])
        num(f"Median {name} (ms):", s[f"median_{key}_ms"])
        num(f"P99 {name} (ms):", s[f"p99_{key}_ms"])
    print("=" * 50)
    if s["token_source"] != "usage":
        print("note: the server streamed no usage; output tokens counted one per text chunk, "
              "input tokens from a max_tokens=1 request per prompt")
    for e in s["errors"][:5]:
        print(f"failed: {e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000",
                    help="server root, without /v1 (default %(default)s)")
    ap.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                    help="/v1/chat/completions (prompts as one user message) or /v1/completions (raw text)")
    ap.add_argument("--model", default="", help="model name sent in requests (default: the first of /v1/models)")
    ap.add_argument("--dataset", default=str(DEFAULT_DATASET),
                    help="prompts JSONL (\"text\"/\"prompt\"/\"messages\" per line; default the built-in set)")
    ap.add_argument("--num-prompts", type=positive_int, default=100)
    ap.add_argument("--request-rate", type=parse_rate, default=math.inf,
                    help="requests per second, Poisson arrivals; 'inf' sends all at once (default)")
    ap.add_argument("--max-concurrency", type=positive_int, default=None,
                    help="at most this many requests in flight")
    ap.add_argument("--max-tokens", type=positive_int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (a vLLM extension)")
    ap.add_argument("--extra-body", default="{}", help="JSON object merged into every request body")
    ap.add_argument("--seed", type=int, default=0, help="seeds the prompt order and arrivals, and is sent as 'seed'")
    ap.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                    help="SLOs in ms, KEY in ttft, tpot, e2el: goodput counts requests meeting all")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY") or os.environ.get("TRELLIS_API_KEY") or "",
                    help="Bearer token (default $OPENAI_API_KEY or $TRELLIS_API_KEY)")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default %(default)s)")
    ap.add_argument("--label", default="", help="free text stored in the JSON result")
    ap.add_argument("--save-result", metavar="FILE.json", help="write the metrics (and per-request lengths) as JSON")
    ap.add_argument("--save-texts", action="store_true", help="also store each generated text in the JSON result")
    args = ap.parse_args(argv)

    if httpx is None:
        print(f"bench-serve: needs httpx (pip install httpx, or run with the project venv: "
              f"scripts/setup-peers); this is {sys.executable}", file=sys.stderr)
        return 1
    try:
        if not args.base_url.startswith(("http://", "https://")):
            raise InputError(f"--base-url {args.base_url!r}: expected http://HOST:PORT")
        args.base_url = args.base_url.rstrip("/")
        if args.base_url.endswith("/v1"):
            args.base_url = args.base_url[:-3]
        args.url = args.base_url + ("/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions")
        if not (args.temperature >= 0 and math.isfinite(args.temperature)):
            raise InputError(f"--temperature {args.temperature}: must be >= 0")
        try:
            args.extra_body = json.loads(args.extra_body)
        except json.JSONDecodeError as e:
            raise InputError(f"--extra-body: not JSON ({e.msg})") from None
        if not isinstance(args.extra_body, dict):
            raise InputError("--extra-body: must be a JSON object")
        slos = parse_goodput(args.goodput)
        prompts = load_dataset(args.dataset)
        results, duration = asyncio.run(run(args, prompts))
    except InputError as e:
        print(f"bench-serve: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench-serve: interrupted", file=sys.stderr)
        return 130

    summary = summarize(args, results, duration, slos)
    print_report(summary)
    if args.save_result:
        Path(args.save_result).parent.mkdir(parents=True, exist_ok=True)
        with open(args.save_result, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
        print(f"saved {args.save_result}")
    return 0 if summary["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Where a `trellis run`'s time to first token goes, from its --json summary and --trace.

  ttft_breakdown.py RUN.json TRACE.json        one run: JSON breakdown
  ttft_breakdown.py --dir DIR                  every r_LAYOUT_bB_wTAG_rN.json (+ t_... trace)
                                               in DIR: medians per (layout, batch, tag)

Per run: TTFT (the summary's mean), the first token of each microbatch group (scheduler
"recv tokens" of iterations 0..m-1, from the scheduler's start), and per rank the first
forward (iteration 0: start, length, the all-reduces inside it), the LM head, the receive of
the hidden state, and the median decode forward. "crit" is the prefill on the critical path
of group 0: the slowest TP rank's iteration-0 forward of every stage, plus the LM head;
"rest" = group 0's first token - crit (scheduling, input preparation, hand-offs between
stages, logits, sampling, returning the token).
Stage s holds ranks s*t .. s*t+t-1 (the engine's contiguous grid on one host).
"""
import collections, glob, json, re, statistics, sys


def breakdown(run_path, trace_path):
    r = json.load(open(run_path))
    t = json.load(open(trace_path))
    ev = t['traceEvents'] if isinstance(t, dict) else t
    names = {(e['pid'], e['tid']): e['args']['name'] for e in ev if e.get('ph') == 'M' and e['name'] == 'thread_name'}
    xs = [e for e in ev if e.get('ph') == 'X']
    lane = lambda e: names.get((e['pid'], e['tid']))
    it = lambda e: e.get('args', {}).get('iteration')
    sched = [e for e in xs if lane(e) == 'scheduler']
    t0 = min(e['ts'] for e in sched)
    recv = {it(e): e['ts'] + e['dur'] for e in sched if e['name'] == 'recv tokens'}
    pp = int(re.search(r'pp=(\d+)', r['layout']).group(1))
    tp = int(re.search(r'tp=(\d+)', r['layout']).group(1))
    groups = min(pp, r['requests'])
    out = {'pp': pp, 'tp': tp, 'ttft_ms': r['ttft']['mean_s'] * 1e3, 'tpot_ms': r['tpot']['mean_s'] * 1e3,
           'first_tokens_ms': [(recv[i] - t0) / 1e3 for i in range(groups)], 'ranks': {},
           'startup': r.get('startup', {})}
    for pid in sorted({e['pid'] for e in xs}):
        mine = [e for e in xs if e['pid'] == pid and lane(e) == 'forward']
        f0 = [e for e in mine if e['name'] == 'forward' and it(e) == 0]
        if not f0:
            continue
        f0 = f0[0]
        ar = [e for e in mine if e['name'] == 'all-reduce' and f0['ts'] <= e['ts'] <= f0['ts'] + f0['dur']]
        d = {'fwd0_start': (f0['ts'] - t0) / 1e3, 'fwd0': f0['dur'] / 1e3, 'fwd0_allreduce': sum(e['dur'] for e in ar) / 1e3}
        for nm in ('recv hidden', 'send hidden', 'lm head'):
            x = [e for e in mine if e['name'] == nm and it(e) == 0]
            if x:
                d[nm] = x[0]['dur'] / 1e3
        dec = [e['dur'] / 1e3 for e in mine if e['name'] == 'forward' and it(e) is not None and it(e) >= 2 * groups]
        d['decode_fwd_median'] = statistics.median(dec) if dec else None
        out['ranks'][pid] = d
    rk = out['ranks']
    stage_fwd = [max(rk[s * tp + k]['fwd0'] for k in range(tp)) for s in range(pp)]
    lm = max(rk[(pp - 1) * tp + k].get('lm head', 0) for k in range(tp))
    out['stage_prefill_ms'] = stage_fwd
    out['crit_ms'] = sum(stage_fwd) + lm
    out['rest_ms'] = out['first_tokens_ms'][0] - out['crit_ms']
    return out


def aggregate(directory):
    rows = collections.defaultdict(list)
    for f in sorted(glob.glob(f'{directory}/r_*.json')):
        m = re.match(r'.*/r_(\d+x\d+)_b(\d+)_w(\w+?)_r(\d+)\.json$', f)
        if not m:
            continue
        try:
            rows[(m.group(1), int(m.group(2)), m.group(3))].append(breakdown(f, f.replace('/r_', '/t_')))
        except (OSError, ValueError, KeyError) as e:
            print(f'skipped {f}: {e}', file=sys.stderr)
    med = lambda xs: round(statistics.median(xs), 1) if xs else None
    print(f"{'layout':6} {'B':>3} {'tag':>9} {'n':>2} {'TTFT':>7} {'first token/group':>18} {'crit':>7} {'rest':>5} "
          f"{'prefill per stage':>18} {'AR in prefill':>13} {'decode fwd':>10} {'TPOT':>6} {'warm-up':>7}")
    for (layout, b, tag), ds in sorted(rows.items()):
        g = len(ds[0]['first_tokens_ms'])
        ft = [med([d['first_tokens_ms'][i] for d in ds]) for i in range(g)]
        sf = [med([d['stage_prefill_ms'][s] for d in ds]) for s in range(ds[0]['pp'])]
        ar = med([max(r['fwd0_allreduce'] for r in d['ranks'].values()) for d in ds])
        dec = med([d['ranks'][0]['decode_fwd_median'] for d in ds])
        wu = med([d['startup'].get('warmup_s', 0) * 1e3 for d in ds])
        print(f"{layout:6} {b:>3} {tag:>9} {len(ds):>2} {med([d['ttft_ms'] for d in ds]):>7} {str(ft):>18} "
              f"{med([d['crit_ms'] for d in ds]):>7} {med([d['rest_ms'] for d in ds]):>5} {str(sf):>18} {ar:>13} "
              f"{dec:>10} {med([d['tpot_ms'] for d in ds]):>6} {wu:>7}")


if __name__ == '__main__':
    if len(sys.argv) == 3 and sys.argv[1] == '--dir':
        aggregate(sys.argv[2])
    elif len(sys.argv) == 3:
        print(json.dumps(breakdown(sys.argv[1], sys.argv[2]), indent=1))
    else:
        sys.exit(__doc__)

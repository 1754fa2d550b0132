#!/usr/bin/env python3
"""Hugging Face transformers reference outputs for tern's model tests.

Two steps, on two machines:

  1. Here (needs only a built tern): write the random-weight fixtures that
     tests/golden/manifest.json lists, with build/tools/make_fixture:
       python3 tools/hf_goldens.py fixtures BUILD_DIR SHARED_DIR OUT_DIR
  2. On a machine with PyTorch + transformers: run every fixture and every
     shared model and write one tests/golden/<name>.json each:
       python3 tools/hf_goldens.py goldens FIXTURE_DIR SHARED_DIR OUT_DIR [NAME...]
     (NAMEs: only those manifest entries; both steps take them)

Each golden holds, per prompt (token ids, no tokenizer involved): the top-5
[id, logit] of every prompt position from one float32 forward pass, and 64
greedy ids continued from it (each step a full float32 forward over the whole
sequence, no cache, argmax) with the step's top1 - top2 logit gap, so a test
can tell a real mismatch from a near-tie. Models stored in bf16 also get the
top-5 of a bf16-compute forward (HF's native dtype) for the bf16 envelope.
Also recorded: library versions, the config transformers actually built, and
every rotary inv_freq buffer, so a disagreement can be traced to its cause.
The manifest's "repo" models (the demo pair under models/) are read from this
repository; golden_one() writes one golden for any folder (the demo's
fine-tuning script, tools/demo/finetune.py, calls it for the new pair).
TF32 is off and attention is "eager" (softcapping needs it); mixtures of
experts run transformers' "eager" expert loop where the version offers a
choice (recorded as experts_implementation).
"""
import json
import os
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, '..', 'tests', 'golden', 'manifest.json')


def make_fixtures(build, shared, out, *only):
    man = json.load(open(MANIFEST))
    os.makedirs(out, exist_ok=True)
    for name, args in man['fixtures'].items():
        if only and name not in only:
            continue
        d = os.path.join(out, name)
        cmd = [os.path.join(build, 'tools', 'make_fixture')] + args + [
            '--out', d, '--tokenizer', os.path.join(shared, man['tokenizer'])]
        subprocess.run(cmd, check=True)
        print('wrote', d)


def top5(row):
    import torch
    v, i = torch.topk(row.float(), 5)
    return [[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())]


def load(path, dtype, dev):
    """The model in eager attention (and eager experts, where offered)."""
    from transformers import AutoModelForCausalLM
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation='eager',
                                                 experts_implementation='eager')
        impl = 'eager'
    except (TypeError, ValueError):
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation='eager')
        impl = 'default'
    m = m.to(dev)
    m.eval()
    return m, impl


def run_model(path, prompts, n_new, dev):
    import torch
    cfg = json.load(open(os.path.join(path, 'config.json')))
    stored = cfg.get('torch_dtype') or cfg.get('dtype') or 'float32'
    model, impl = load(path, torch.float32, dev)
    res = {'stored_dtype': stored, 'hf_class': type(model).__name__, 'experts_implementation': impl,
           'config_seen': json.loads(json.dumps(model.config.to_dict(), default=str)),
           'inv_freq': {n: b.float().cpu().tolist() for n, b in model.named_buffers() if 'inv_freq' in n},
           'prompts': []}
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids], device=dev)
            lg = model(x).logits[0]
            p = {'ids': ids, 'top5': [top5(lg[t]) for t in range(len(ids))], 'greedy': [], 'gap': []}
            seq = list(ids)
            for _ in range(n_new):
                last = model(torch.tensor([seq], device=dev)).logits[0, -1].float()
                v, i = torch.topk(last, 2)
                p['greedy'].append(int(i[0]))
                p['gap'].append(float(v[0] - v[1]))
                seq.append(int(i[0]))
            res['prompts'].append(p)
        if 'bfloat16' in stored:
            mb, _ = load(path, torch.bfloat16, dev)
            res['bf16_compute'] = []
            for ids in prompts:
                lg = mb(torch.tensor([ids], device=dev)).logits[0]
                res['bf16_compute'].append([top5(lg[t]) for t in range(len(ids))])
            del mb
    del model
    return res


def golden_one(name, path, origin, out, dev):
    """Writes OUT/<name>.json for the model folder at path; origin says where
    the test finds it ({'make_fixture_args': [...]}, {'shared_model': p} or
    {'repo_model': p}). Expects TF32 off (see goldens())."""
    import torch
    import transformers
    man = json.load(open(MANIFEST))
    versions = {'torch': torch.__version__, 'transformers': transformers.__version__,
                'device': torch.cuda.get_device_name(0) if dev == 'cuda' else 'cpu'}
    vocab = json.load(open(os.path.join(path, 'config.json')))['vocab_size']
    prompts = man['prompts_small_vocab'] if vocab <= 4096 else man['prompts_large_vocab']
    r = run_model(path, prompts, man['new_tokens'], dev)
    rel = origin.get('repo_model') or origin.get('shared_model')
    if rel:  # where the test finds it, not where it was read from
        r['config_seen']['_name_or_path'] = rel
    r.update(origin)
    r['name'] = name
    r['source'] = ('tools/hf_goldens.py: transformers float32 (TF32 off, eager attention) on %s; '
                   'greedy = full forward per step, argmax' % versions['device'])
    r['versions'] = versions
    with open(os.path.join(out, name + '.json'), 'w') as f:
        json.dump(r, f, indent=0, separators=(',', ':'))
    print('OK', name, 'gaps min %.3g' % min(min(p['gap']) for p in r['prompts']), flush=True)


def goldens(fixdir, shared, out, *only):
    import torch
    import transformers
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    man = json.load(open(MANIFEST))
    os.makedirs(out, exist_ok=True)
    print('transformers', transformers.__version__, 'on', dev, flush=True)
    jobs = [(n, os.path.join(fixdir, n), {'make_fixture_args': a}) for n, a in man['fixtures'].items()]
    jobs += [(n, os.path.join(shared, p), {'shared_model': p}) for n, p in man['shared'].items()]
    jobs += [(n, os.path.join(HERE, '..', p), {'repo_model': p}) for n, p in man.get('repo', {}).items()]
    failed = []
    for name, path, origin in jobs:
        if only and name not in only:
            continue
        try:
            golden_one(name, path, origin, out, dev)
        except Exception:
            failed.append(name)
            print('FAILED', name, traceback.format_exc(), flush=True)
    print('done; failed:', failed)
    return 1 if failed else 0


if __name__ == '__main__':
    if len(sys.argv) < 5 or sys.argv[1] not in ('fixtures', 'goldens'):
        sys.exit(__doc__)
    if sys.argv[1] == 'fixtures':
        make_fixtures(*sys.argv[2:])
    else:
        sys.exit(goldens(*sys.argv[2:]))

#!/usr/bin/env python3
"""PEFT reference outputs for tern's LoRA adapters (tests/golden/lora/peft.json).

Two steps, on two machines:

  1. Here (needs only a built tern): write every base fixture the cases of
     tests/golden/lora/manifest.json use (build/tools/make_fixture with the
     arguments of tests/golden/manifest.json) and every case's random adapter
     (build/tools/make_lora):
       python3 tools/lora_goldens.py fixtures BUILD_DIR SHARED_DIR OUT_DIR
  2. On a machine with PyTorch + transformers + peft: load each base in
     float32 (eager attention, TF32 off), wrap it with PeftModel.from_pretrained
     on the case's adapter folder, and record the top-5 [id, logit] of every
     position of the small-vocabulary prompts, plus 16 greedy ids per prompt
     (full forward per step, argmax) with their top1 - top2 gaps:
       python3 tools/lora_goldens.py goldens FIXTURE_DIR OUT_FILE

Also recorded per case: the library versions and the scaling PEFT applied to
each adapted module of layer 0 and the last layer, so a disagreement over
r / alpha / rsLoRA / rank_pattern / alpha_pattern can be traced.
"""
import json
import os
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, '..', 'tests', 'golden', 'manifest.json')
LORA_MANIFEST = os.path.join(HERE, '..', 'tests', 'golden', 'lora', 'manifest.json')
N_GREEDY = 16


def make_fixtures(build, shared, out):
    man = json.load(open(MANIFEST))
    lman = json.load(open(LORA_MANIFEST))
    os.makedirs(out, exist_ok=True)
    bases = sorted({c['base'] for c in lman['cases'].values()})
    for b in bases:
        d = os.path.join(out, b)
        subprocess.run([os.path.join(build, 'tools', 'make_fixture')] + man['fixtures'][b] +
                       ['--out', d, '--tokenizer', os.path.join(shared, man['tokenizer'])], check=True)
        print('wrote', d)
    for name, c in lman['cases'].items():
        d = os.path.join(out, 'lora-' + name)
        subprocess.run([os.path.join(build, 'tools', 'make_lora'), '--base', os.path.join(out, c['base']),
                        '--out', d] + c['make_lora_args'], check=True)
        print('wrote', d)


def top5(row):
    import torch
    v, i = torch.topk(row.float(), 5)
    return [[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())]


def run_case(fixdir, name, c, prompts, dev):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(os.path.join(fixdir, c['base']), dtype=torch.float32,
                                                attn_implementation='eager').to(dev)
    model = PeftModel.from_pretrained(base, os.path.join(fixdir, 'lora-' + name)).to(dev)
    model.eval()
    scal = {}
    for mn, mod in model.named_modules():
        if hasattr(mod, 'scaling') and isinstance(getattr(mod, 'scaling'), dict) and mod.scaling:
            scal[mn] = {'scaling': float(mod.scaling.get('default', 0)), 'r': int(mod.r.get('default', 0))}
    res = {'base': c['base'], 'make_lora_args': c['make_lora_args'], 'scaling': scal, 'prompts': []}
    with torch.no_grad():
        for ids in prompts:
            lg = model(torch.tensor([ids], device=dev)).logits[0]
            p = {'ids': ids, 'top5': [top5(lg[t]) for t in range(len(ids))], 'greedy': [], 'gap': []}
            seq = list(ids)
            for _ in range(N_GREEDY):
                last = model(torch.tensor([seq], device=dev)).logits[0, -1].float()
                v, i = torch.topk(last, 2)
                p['greedy'].append(int(i[0]))
                p['gap'].append(float(v[0] - v[1]))
                seq.append(int(i[0]))
            res['prompts'].append(p)
    del model, base
    return res


def goldens(fixdir, out):
    import peft
    import torch
    import transformers
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    man = json.load(open(MANIFEST))
    lman = json.load(open(LORA_MANIFEST))
    versions = {'torch': torch.__version__, 'transformers': transformers.__version__, 'peft': peft.__version__,
                'device': torch.cuda.get_device_name(0) if dev == 'cuda' else 'cpu'}
    print(versions, flush=True)
    doc = {'source': 'tools/lora_goldens.py: transformers + peft float32 (TF32 off, eager attention) on %s; '
                     'greedy = full forward per step, argmax' % versions['device'],
           'versions': versions, 'cases': {}}
    failed = []
    for name, c in lman['cases'].items():
        try:
            doc['cases'][name] = run_case(fixdir, name, c, man['prompts_small_vocab'], dev)
            print('OK', name, 'gap min %.3g' % min(min(p['gap']) for p in doc['cases'][name]['prompts']),
                  flush=True)
        except Exception:
            failed.append(name)
            print('FAILED', name, traceback.format_exc(), flush=True)
    with open(out, 'w') as f:
        json.dump(doc, f, indent=0, separators=(',', ':'))
    print('done; failed:', failed)
    return 1 if failed else 0


if __name__ == '__main__':
    if len(sys.argv) == 5 and sys.argv[1] == 'fixtures':
        make_fixtures(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == 'goldens':
        sys.exit(goldens(*sys.argv[2:]))
    else:
        sys.exit(__doc__)

#!/usr/bin/env python3
"""sentence-transformers reference embeddings for tern's /v1/embeddings tests.

The embedding folders are not stored: each is a recipe under tests/embedding/
(modules.json, 1_Pooling/config.json, sentence_bert_config.json, optionally
config_sentence_transformers.json, and recipe.json naming the base model),
laid over a model tern already has. Two steps:

  1. Build the folders (symlinks to the base model's files + the recipe's
     files; every module path exists as a folder):
       python3 tools/st_goldens.py folders MODELS_ROOT SHARED_DIR OUT_DIR
     MODELS_ROOT holds models/ (the repository root); SHARED_DIR is the
     folder a base of "../shared/..." refers to.
  2. On a machine with PyTorch + sentence-transformers, write one
     tests/golden/embed_<recipe>.json each:
       python3 tools/st_goldens.py goldens FOLDERS_DIR OUT_DIR

Per text of TEXTS, a golden holds: the token ids sentence-transformers fed
the model (its default prompt, if the recipe has one, prepended as its
encode() does; special tokens as its tokenizer adds them), the embedding
SentenceTransformer.encode returned (float32 weights and compute, CPU,
batch size 1 so that no padding is involved), and for every d of DIMS the
embedding encode(truncate_dim=d) returned, then L2-normalised (tern's
`dimensions` truncates and renormalises, as OpenAI's models do). As a
cross-check, the same pooling is computed by hand from transformers'
AutoModel last_hidden_state over the recorded ids and its largest
difference from sentence-transformers is recorded ("manual_max_abs_diff").
Library versions are recorded too.

Goldens in tests/golden/embed_*.json were made with this script with
sentence-transformers 6.0.1, transformers 5.17.0, torch 2.11.0 (CPU, f32).
"""
import json
import os
import shutil
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPES = os.path.join(HERE, '..', 'tests', 'embedding')

TEXTS = [
    'The quick brown fox jumps over the lazy dog.',
    'Once upon a time, there was a little girl named Lily. She loved to play outside in the park.',
    'tern',
    'Embeddings map text to vectors; similar texts land close together, different ones far apart.',
    'Caf\u00e9 na\u00efve \u2013 tea \u2615 and 12345',
]
DIMS = [16, 32]


def recipe_files(rdir):
    for base, _, files in os.walk(rdir):
        for f in files:
            rel = os.path.relpath(os.path.join(base, f), rdir)
            if rel != 'recipe.json':
                yield rel


def build_folders(models_root, shared, out):
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(RECIPES)):
        rdir = os.path.join(RECIPES, name)
        recipe = json.load(open(os.path.join(rdir, 'recipe.json')))
        base = recipe['base']
        if base.startswith('../shared/'):
            src = os.path.join(shared, base[len('../shared/'):])
        else:
            src = os.path.join(models_root, base)
        src = os.path.abspath(src)
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        own = set(recipe_files(rdir))
        for f in os.listdir(src):
            p = os.path.join(src, f)
            if os.path.isfile(p) and f not in own:
                os.symlink(p, os.path.join(d, f))
        for rel in own:
            os.makedirs(os.path.dirname(os.path.join(d, rel)) or d, exist_ok=True)
            shutil.copy(os.path.join(rdir, rel), os.path.join(d, rel))
        for m in json.load(open(os.path.join(rdir, 'modules.json'))):
            if m.get('path'):
                os.makedirs(os.path.join(d, m['path']), exist_ok=True)
        print('built', d, 'from', src)


def pool_config(path):
    mods = json.load(open(os.path.join(path, 'modules.json')))
    pool, norm = None, False
    for m in mods:
        kind = m['type'].rsplit('.', 1)[-1]
        if kind == 'Pooling':
            pool = json.load(open(os.path.join(path, m['path'], 'config.json')))
        elif kind == 'Normalize':
            norm = True
    mode = [k for k in ('pooling_mode_cls_token', 'pooling_mode_mean_tokens', 'pooling_mode_lasttoken')
            if pool.get(k)][0]
    return mode, norm


def manual(path, ids, mode, norm):
    import torch
    from transformers import AutoModel
    if path not in manual.cache:
        manual.cache[path] = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    h = manual.cache[path](input_ids=torch.tensor([ids])).last_hidden_state[0]
    if mode == 'pooling_mode_cls_token':
        v = h[0]
    elif mode == 'pooling_mode_lasttoken':
        v = h[-1]
    else:
        v = h.mean(0)
    if norm:
        v = torch.nn.functional.normalize(v, dim=0)
    return v


manual.cache = {}


def unit(v):
    import numpy as np
    v = np.asarray(v, dtype=np.float64)
    return (v / np.linalg.norm(v)).tolist()


def make_goldens(folders, out):
    import numpy as np
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    torch.set_grad_enabled(False)
    os.makedirs(out, exist_ok=True)
    versions = {'sentence_transformers': sentence_transformers.__version__,
                'transformers': transformers.__version__, 'torch': torch.__version__}
    print(versions, flush=True)
    for name in sorted(os.listdir(RECIPES)):
        path = os.path.join(folders, name)
        try:
            try:
                st = SentenceTransformer(path, device='cpu', model_kwargs={'dtype': torch.float32})
            except TypeError:
                st = SentenceTransformer(path, device='cpu')
            st = st.float()
            tok = st.tokenizer
            if tok.pad_token is None:  # a single input is never padded, but the tokenizer asks for one
                tok.pad_token = tok.eos_token or tok.unk_token
            prompt_name = getattr(st, 'default_prompt_name', None)
            prompt = (getattr(st, 'prompts', None) or {}).get(prompt_name, '') if prompt_name else ''
            mode, norm = pool_config(path)
            dimf = getattr(st, 'get_sentence_embedding_dimension', None) or getattr(st, 'get_embedding_dimension')
            res = {'recipe': name, 'versions': versions, 'modules': [type(m).__name__ for m in st],
                   'pooling': mode, 'normalize': norm, 'prompt': prompt,
                   'dim': int(dimf()), 'dims': DIMS, 'inputs': []}
            worst = 0.0
            for t in TEXTS:
                emb = st.encode([t], batch_size=1, convert_to_numpy=True)[0].astype(np.float32)
                try:
                    ids = st.tokenize([prompt + t])['input_ids'][0].tolist()
                except AttributeError:
                    ids = tok([prompt + t])['input_ids'][0]
                ref = manual(path, ids, mode, norm).numpy()
                worst = max(worst, float(np.abs(ref - emb).max()))
                if prompt:  # would the golden also match without the prompt? (it must not)
                    ids0 = tok([t])['input_ids'][0]
                    res['manual_without_prompt_diff'] = float(np.abs(manual(path, ids0, mode, norm).numpy() - emb).max())
                item = {'text': t, 'ids': [int(i) for i in ids], 'embedding': [float(x) for x in emb],
                        'truncated': {}}
                for d in DIMS:
                    try:
                        e = st.encode([t], batch_size=1, convert_to_numpy=True, truncate_dim=d)[0]
                        res['truncate_via'] = 'encode(truncate_dim)'
                    except TypeError:
                        e = emb[:d]
                        res['truncate_via'] = 'slice'
                    item['truncated'][str(d)] = unit(e)
                res['inputs'].append(item)
            res['manual_max_abs_diff'] = worst
            with open(os.path.join(out, 'embed_%s.json' % name), 'w') as f:
                json.dump(res, f, indent=1)
            print(name, res['modules'], mode, 'normalize' if norm else '', 'prompt=%r' % prompt,
                  'manual diff %.3g' % worst, flush=True)
        except Exception:
            traceback.print_exc()
            print('FAILED', name, flush=True)


if __name__ == '__main__':
    if len(sys.argv) == 5 and sys.argv[1] == 'folders':
        build_folders(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == 'goldens':
        make_goldens(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)

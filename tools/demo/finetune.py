#!/usr/bin/env python3
"""Fine-tune the demo pair (models/tern-demo, models/tern-demo-draft) to call
tools, on one GPU, within a fixed wall-clock budget; evaluate; write HF
goldens. See README.md for the whole procedure.

  1. read the recipe's corpus file (text + synthetic chats) and the tool
     conversations of make_tool_data.py; tokenize with the unchanged
     tokenizer of models/tern-demo
  2. training stream: a random part of the plain-text documents (TERN_TEXT_FRAC)
     plus every chat and tool record, shuffled; 3/4 of the windows start at a
     record start; windows of TERN_FT_SEQ tokens (tool prompts are longer
     than the 512 tokens the pair was first trained on)
  3. target: continue from its current weights (AdamW, short warmup, cosine);
     every ~20 s the held-out text loss (64 windows of 512) and the held-out
     tool completion loss are measured; the kept checkpoint is the one with the
     lowest tool loss whose text loss is within TERN_TEXT_SLACK of the start
  4. save it (bf16, same shards, config and tokenizer files unchanged, the
     tool-aware chat template in tokenizer_config.json)
  5. draft: continue from its current weights with 0.3 CE + 0.7 KL to the new
     target (as the recipe distilled it), save
  6. evaluate the reloaded files with the recipe's functions (held-out text
     and chat loss, format checks, greedy speculative acceptance) plus tool
     checks on held-out tool conversations (calls parse, validate against the
     tool's schema, right names, exact arguments; plain answers where no call
     is wanted), and render checks of the template under apply_chat_template
  7. HF goldens of both new folders (tools/hf_goldens.py golden_one)
  8. pack both folders, eval.json and the goldens into $OUT (tars <= 15 MiB)

Environment: TERN_RECIPE (recipe folder), TERN_DATA (recipe data file),
TERN_TOOLS (tool data file), TERN_MODELS (folder holding tern-demo and
tern-demo-draft), OUT, TERN_WORK, TERN_TARGET_S, TERN_DRAFT_S.
"""
import json
import os
import shutil
import sys
import time
import traceback
import lzma

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.environ['TERN_RECIPE']
MODELS = os.environ['TERN_MODELS']
TOOLS_DATA = os.environ['TERN_TOOLS']
TARGET_S = float(os.environ.get('TERN_TARGET_S', '100'))
DRAFT_S = float(os.environ.get('TERN_DRAFT_S', '60'))
FT_SEQ = int(os.environ.get('TERN_FT_SEQ', '1024'))
FT_BATCH = int(os.environ.get('TERN_FT_BATCH', '128'))
TEXT_FRAC = float(os.environ.get('TERN_TEXT_FRAC', '0.4'))
TEXT_SLACK = float(os.environ.get('TERN_TEXT_SLACK', '1.035'))
TARGET_LR = float(os.environ.get('TERN_TARGET_LR', '6e-4'))
DRAFT_LR = float(os.environ.get('TERN_DRAFT_LR', '1e-3'))
TOOL_EVAL_PER_COMBO = int(os.environ.get('TERN_TOOL_EVAL_PER_COMBO', '12'))
os.environ.setdefault('TERN_TOTAL_S', '100000')
sys.path.insert(0, RECIPE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..'))
import train_tern as tt  # noqa: E402  (the recipe: loaders, eval functions)
from chat_format_tools import CHAT_TEMPLATE, render  # noqa: E402
import toolcheck  # noqa: E402
import hf_goldens  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

log = tt.log
DEV = tt.DEV
VOCAB = tt.VOCAB
IM_END, EOT = tt.IM_END, tt.EOT
WORK = tt.WORK
OUT = tt.OUT
R = {'target': {}, 'draft': {}, 'checks': {}, 'tools': {}}


def guarded(what, fn, *a):
    try:
        return fn(*a)
    except Exception:
        log('%s failed\n%s' % (what, traceback.format_exc()))
        R['checks']['failed_' + what] = True
        return None


# ------------------------------------------------------------------ data

def load_tools():
    tr, va = [], []
    with lzma.open(TOOLS_DATA, 'rt', encoding='utf-8') as f:
        for line in f:
            r = json.loads(line)
            (va if r['v'] else tr).append(r)
    log('tool records: train %d, held out %d' % (len(tr), len(va)))
    return tr, va


def build_stream(tok, texts, chats, tools_tr):
    rng = np.random.default_rng(99)
    keep = [t for t in texts[0] if rng.random() < TEXT_FRAC]
    t_ids = tt.encode_all(tok, keep)
    pairs = [(p, c) for p, c, _, _ in chats[0]] + [(r['p'], r['c']) for r in tools_tr]
    p_ids = tt.encode_all(tok, [p for p, _ in pairs])
    c_ids = tt.encode_all(tok, [c for _, c in pairs])
    nl = tok.encode('\n', add_special_tokens=False).ids
    items = [(np.array(ids + [EOT], dtype=np.int32), None) for ids in t_ids]
    n_tool_tok = 0
    for i, (p, c) in enumerate(zip(p_ids, c_ids)):
        ids = p + c + [IM_END] + nl + [EOT]
        m = np.zeros(len(ids), dtype=np.uint8)
        m[len(p):len(p) + len(c) + 1] = 1
        items.append((np.array(ids, dtype=np.int32), m))
        if i >= len(chats[0]):
            n_tool_tok += len(ids)
    order = rng.permutation(len(items))
    parts, masks, starts, pos = [], [], [], 0
    for i in order:
        ids, m = items[i]
        parts.append(ids)
        masks.append(m if m is not None else np.ones(len(ids), dtype=np.uint8))
        starts.append(pos)
        pos += len(ids)
    stream = np.concatenate(parts)
    mask = np.concatenate(masks)
    starts = np.array(starts, dtype=np.int64)
    starts = starts[starts + FT_SEQ + 1 <= len(stream)]
    longest = max(len(p) + len(c) for p, c in zip(p_ids[len(chats[0]):], c_ids[len(chats[0]):]))
    log('fine-tune stream: %d tokens (%d text docs of %d, %.1f%% tool-record tokens, %.1f%% in the loss); '
        'longest tool record %d tokens' % (len(stream), len(keep), len(texts[0]), 100.0 * n_tool_tok / len(stream),
                                          100.0 * mask.mean(), longest))
    R['data'] = dict(stream_tokens=int(len(stream)), text_docs=len(keep), tool_record_tokens=int(n_tool_tok),
                     chat_records=len(chats[0]), tool_records=len(tools_tr), longest_tool_record=int(longest),
                     seq_len=FT_SEQ, batch=FT_BATCH)
    return stream, mask, starts


class Batcher:
    def __init__(self, stream, mask, starts, seed):
        self.stream = torch.from_numpy(stream.astype(np.int64)).to(DEV)
        self.mask = torch.from_numpy(mask.astype(np.float32)).to(DEV)
        self.starts = torch.from_numpy(starts).to(DEV)
        self.g = torch.Generator(device=DEV)
        self.g.manual_seed(seed)
        self.ar = torch.arange(FT_SEQ + 1, device=DEV)
        self.n = len(stream)

    def get(self, b):
        k = (3 * b) // 4
        a = self.starts[torch.randint(0, len(self.starts), (k,), device=DEV, generator=self.g)]
        r = torch.randint(0, self.n - FT_SEQ - 1, (b - k,), device=DEV, generator=self.g)
        idx = torch.cat([a, r])[:, None] + self.ar[None, :]
        w = self.stream[idx]
        return w[:, :-1], w[:, 1:], self.mask[idx[:, 1:]]


def pc_batches(pcs, bs=64, max_len=1100):
    """(ids, mask) batches of prompt+completion+<|im_end|>, mask on the completion."""
    for i in range(0, len(pcs), bs):
        chunk = pcs[i:i + bs]
        seqs = [(p + c + [IM_END])[:max_len] for p, c in chunk]
        L = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), L, dtype=torch.long)
        m = torch.zeros(len(seqs), L)
        for j, ((p, c), s) in enumerate(zip(chunk, seqs)):
            ids[j, :len(s)] = torch.tensor(s)
            m[j, len(p):len(s)] = 1.0
        yield ids.to(DEV), m.to(DEV)


@torch.no_grad()
def completion_loss(model, pcs):
    was = model.training
    model.eval()
    tot = n = 0.0
    for ids, m in pc_batches(pcs):
        lg = tt.model_logits(model, ids[:, :-1]).float()
        ce = F.cross_entropy(lg.reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction='none').view_as(m[:, 1:])
        tot += (ce * m[:, 1:]).sum().item()
        n += m[:, 1:].sum().item()
    model.train(was)
    return tot / max(n, 1)


# ------------------------------------------------------------------ training

def finetune(model, name, lr_peak, warmup, batcher, seconds, val_windows, tool_val, teacher=None, kd=0.7):
    model.to(DEV)
    model.train()
    opt = tt.make_opt(model, lr_peak)
    t_start = time.time()
    deadline = t_start + seconds
    base_text = tt.quick_val(model, val_windows)
    base_tool = completion_loss(model, tool_val)
    hist = [(0.0, 0, base_text, round(base_tool, 4))]
    log('%s start: text %.4f tool %.4f' % (name, base_text, base_tool))
    best = (float('inf'), None, 0)
    step = tokens = 0
    last_val = time.time()
    while True:
        frac = (time.time() - t_start) / seconds
        if frac >= 1.0:
            break
        lr = lr_peak * min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * frac)))
        for g in opt.param_groups:
            g['lr'] = lr
        x, y, m = batcher.get(FT_BATCH)
        logp = F.log_softmax(tt.model_logits(model, x).float(), dim=-1)
        ce = F.nll_loss(logp.reshape(-1, VOCAB), y.reshape(-1), reduction='none').view_as(m)
        if teacher is not None:
            with torch.no_grad():
                t_logp = F.log_softmax(tt.model_logits(teacher, x).float(), dim=-1)
            per = (1 - kd) * ce + kd * F.kl_div(logp, t_logp, log_target=True, reduction='none').sum(-1)
            del t_logp
        else:
            per = ce
        loss = (per * m).sum() / m.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        if not torch.isfinite(loss).item():
            log('%s: non-finite loss at step %d, skipped' % (name, step))
            continue
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        if step % 25 == 0 or step <= 2:
            log('%s step %4d loss %.4f lr %.2e %.0f tok/s' % (name, step, loss.item(), lr,
                                                            tokens / max(1e-6, time.time() - t_start)))
        end = time.time() >= deadline
        if time.time() - last_val > 20 or end:
            vt = tt.quick_val(model, val_windows)
            vl = completion_loss(model, tool_val)
            hist.append((round(time.time() - t_start, 1), step, round(vt, 4), round(vl, 4)))
            log('%s val at step %d: text %.4f tool %.4f' % (name, step, vt, vl))
            if vt <= base_text * TEXT_SLACK and vl < best[0]:
                best = (vl, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
            last_val = time.time()
    used = step
    if best[1] is not None and best[2] != step:
        model.load_state_dict(best[1])
        used = best[2]
        log('%s: kept the checkpoint of step %d (tool %.4f)' % (name, used, best[0]))
    elif best[1] is None:
        log('%s: WARNING no checkpoint met the text-loss bound; keeping the last' % name)
    del opt
    return dict(steps=step, tokens=tokens, seconds=round(time.time() - t_start, 1), peak_lr=lr_peak,
                warmup_steps=warmup, seq_len=FT_SEQ, batch=FT_BATCH, kept_step=used,
                objective='0.3*CE + 0.7*KL(target||draft)' if teacher is not None else 'CE',
                val_history_time_step_text_tool=hist)


def save(model, src, dst):
    """Weights from model; every other file of src unchanged except the chat template."""
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    model.to(torch.bfloat16)
    model.save_pretrained(dst, max_shard_size='12MB')
    for f in os.listdir(src):
        if f.endswith('.safetensors') or f.endswith('.index.json') or f in ('README.md', 'eval.json'):
            continue
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    cfg = json.load(open(os.path.join(src, 'tokenizer_config.json'), encoding='utf-8'))
    cfg['chat_template'] = CHAT_TEMPLATE
    with open(os.path.join(dst, 'tokenizer_config.json'), 'w', encoding='utf-8') as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write('\n')
    old = sorted(f for f in os.listdir(src) if f.endswith('.safetensors'))
    new = sorted(f for f in os.listdir(dst) if f.endswith('.safetensors'))
    R['checks']['%s_same_shard_names' % os.path.basename(dst)] = old == new
    log('saved', dst, ', '.join('%s=%d' % (n, os.path.getsize(os.path.join(dst, n))) for n in sorted(os.listdir(dst))))


# ------------------------------------------------------------------ evaluation

TEMPLATE_CASES = [
    dict(messages=[{'role': 'user', 'content': 'What is the weather in Paris?'}], add_generation_prompt=True),
    dict(messages=[{'role': 'system', 'content': 'You are a helpful assistant.'},
                   {'role': 'user', 'content': 'Count the words: The cat sat on the mat.'},
                   {'role': 'assistant', 'content': None, 'tool_calls': [
                       {'id': 'c1', 'type': 'function', 'function': {'name': 'count_words',
                                                                     'arguments': '{"text": "The cat sat on the mat."}'}}]},
                   {'role': 'tool', 'tool_call_id': 'c1', 'content': '{"words": 6}'}],
         add_generation_prompt=True, enable_thinking=False),
    dict(messages=[{'role': 'user', 'content': 'Weather in Oslo and Rome?'},
                   {'role': 'assistant', 'content': '<think>\nTwo cities.\n</think>\n\n', 'tool_calls': [
                       {'id': 'a', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': {'city': 'Oslo'}}},
                       {'id': 'b', 'type': 'function', 'function': {'name': 'get_weather',
                                                                    'arguments': {'city': 'Rome', 'unit': 'celsius'}}}]},
                   {'role': 'tool', 'tool_call_id': 'a', 'content': '{"temperature": 3}'},
                   {'role': 'tool', 'tool_call_id': 'b', 'content': '{"temperature": 18}'},
                   {'role': 'assistant', 'content': 'It is 3 degrees in Oslo and 18 in Rome.'},
                   {'role': 'user', 'content': 'Thanks! Caf\u00e9 \u2014 na\u00efve?'}],
         add_generation_prompt=True, enable_thinking=True),
    dict(messages=[{'role': 'user', 'content': 'Hello'}], add_generation_prompt=True, enable_thinking=False),
]


def template_checks(hf_tok):
    tools = [make_data_tools['get_weather'], make_data_tools['count_words']]
    out = []
    ok = True
    for i, case in enumerate(TEMPLATE_CASES):
        kw = {k: v for k, v in case.items() if k not in ('messages',)}
        use_tools = None if i == 3 else tools
        s = hf_tok.apply_chat_template(case['messages'], tools=use_tools, tokenize=False, **kw)
        want = render(case['messages'], use_tools, kw.get('add_generation_prompt', False), kw.get('enable_thinking'))
        ok = ok and s == want
        out.append(dict(request=dict(case, **({'tools': use_tools} if use_tools else {})), hf_text=s))
    R['checks']['template_hf_equals_python_twin'] = ok
    with open(os.path.join(WORK, 'template_hf.jsonl'), 'w', encoding='utf-8') as f:
        for o in out:
            f.write(json.dumps(o, ensure_ascii=False) + '\n')
    log('template checks: hf == python twin: %s' % ok)


def select_tool_eval(tools_va):
    by = {}
    for r in tools_va:
        kind = 'call' if r['want'] else 'answer'
        by.setdefault((r['task'], kind, r['mode']), []).append(r)
    sel = []
    for k in sorted(by):
        sel.extend(by[k][:TOOL_EVAL_PER_COMBO])
    return sel


def tool_eval(ev, target, draft, hf_tok, sel):
    gens = {}
    for name, m in (('target', target), ('draft', draft)):
        if m is None:
            continue
        outs = tt.generate(m, hf_tok, [r['p'] for r in sel], 256)
        gens[name] = outs
        agg, examples = {}, {}
        for r, o in zip(sel, outs):
            text = hf_tok.decode(o, skip_special_tokens=False)
            res = toolcheck.check_calls(text, r['tools'], r['want'])
            res['ended_with_im_end'] = bool(o) and o[-1] == IM_END
            body = text[:-len('<|im_end|>')] if text.endswith('<|im_end|>') else text
            res['exact'] = toolcheck.strip_think(body) == toolcheck.strip_think(r['c'])
            if r['mode'] == 'think':
                res['think_block'] = body.startswith('<think>\n') and '</think>' in body
            key = '%s/%s/%s' % (r['task'], 'call' if r['want'] else 'answer', r['mode'])
            a = agg.setdefault(key, {'n': 0})
            a['n'] += 1
            for k2, v2 in res.items():
                a[k2] = a.get(k2, 0) + int(bool(v2))
            if key not in examples:
                examples[key] = dict(prompt_tail=r['p'][-300:], reference=r['c'], output=text)
        tot = {}
        for k2, a in agg.items():
            n = a.pop('n')
            for kk, vv in a.items():
                t = tot.setdefault(kk, [0, 0])
                t[0] += vv
                t[1] += n
            agg[k2] = dict(n=n, **{kk: round(vv / n, 3) for kk, vv in a.items()})
        ev[name]['tool_checks_heldout'] = agg
        ev[name]['tool_checks_overall'] = {k2: dict(rate=round(v[0] / v[1], 3), n=v[1]) for k2, v in tot.items()}
        ev[name]['tool_check_examples'] = examples
        log(name, 'tool checks', json.dumps(ev[name]['tool_checks_overall']))
    sel_pc = [(r['task'], r['mode'], r['p'], r['c']) for r in sel]
    if 'target' in gens and draft is not None:
        sub = {}
        tt.ev_speculative(sub, target, draft, hf_tok, sel_pc, gens)
        ev['speculative_on_tool_prompts'] = sub.get('speculative_greedy_on_target_outputs')


def tool_samples(ev, target, hf_tok):
    tools = [make_data_tools['get_weather'], make_data_tools['count_words'], make_data_tools['add']]
    reqs = [('What is the weather in Paris?', False), ('What is the weather in Paris?', True),
            ('Count the words in this text: The quick brown fox jumps over the lazy dog.', False),
            ('What is 12 plus 30?', False), ('Hello! Who are you?', False)]
    prompts = [hf_tok.apply_chat_template([{'role': 'user', 'content': u}], tools=tools, tokenize=False,
                                          add_generation_prompt=True, enable_thinking=th) for u, th in reqs]
    outs = tt.generate(target, hf_tok, prompts, 128)
    ev['target']['tool_samples'] = [dict(user=u, enable_thinking=th, output=hf_tok.decode(o, skip_special_tokens=False))
                                    for (u, th), o in zip(reqs, outs)]
    for s in ev['target']['tool_samples']:
        log('tool sample', json.dumps(s, ensure_ascii=False))


make_data_tools = None


def main():
    global make_data_tools
    import make_tool_data
    make_data_tools = make_tool_data.TOOLS
    src_t = os.path.join(MODELS, 'tern-demo')
    src_d = os.path.join(MODELS, 'tern-demo-draft')
    dst_t = os.path.join(WORK, 'tern-demo')
    dst_d = os.path.join(WORK, 'tern-demo-draft')
    R['environment'] = dict(torch=torch.__version__, device=torch.cuda.get_device_name(0) if DEV == 'cuda' else 'cpu',
                            transformers=__import__('transformers').__version__)
    texts, chats = tt.load_data()
    tools_tr, tools_va = load_tools()
    tok = Tokenizer.from_file(os.path.join(src_t, 'tokenizer.json'))
    stream, mask, starts = build_stream(tok, texts, chats, tools_tr)
    val_text = np.concatenate([np.array(ids + [EOT], dtype=np.int32) for ids in tt.encode_all(tok, texts[1])])
    res_val = dict(p_ids=tt.encode_all(tok, [c[0] for c in chats[1]]), c_ids=tt.encode_all(tok, [c[1] for c in chats[1]]))
    tv = tools_va[:384]
    tool_val = list(zip(tt.encode_all(tok, [r['p'] for r in tv]), tt.encode_all(tok, [r['c'] for r in tv])))
    g = torch.Generator().manual_seed(7)
    offs = torch.randint(0, len(val_text) - 512 - 1, (64,), generator=g)
    vt = torch.from_numpy(val_text.astype(np.int64))
    val_windows = torch.stack([vt[o:o + 513] for o in offs.tolist()]).to(DEV)
    log('setup done')

    batcher = Batcher(stream, mask, starts, seed=5)
    target = AutoModelForCausalLM.from_pretrained(src_t, dtype=torch.float32).to(DEV)
    R['target']['finetune'] = finetune(target, 'target', TARGET_LR, 30, batcher, TARGET_S, val_windows, tool_val)
    save(target, src_t, dst_t)
    del target
    teacher = AutoModelForCausalLM.from_pretrained(dst_t, dtype=torch.bfloat16).to(DEV).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    draft = AutoModelForCausalLM.from_pretrained(src_d, dtype=torch.float32).to(DEV)
    R['draft']['finetune'] = finetune(draft, 'draft', DRAFT_LR, 30, batcher, DRAFT_S, val_windows, tool_val,
                                      teacher=teacher)
    save(draft, src_d, dst_d)
    del draft, teacher, batcher
    torch.cuda.empty_cache()

    hf_tok = AutoTokenizer.from_pretrained(dst_t)
    guarded('template', template_checks, hf_tok)
    R['checks']['tokenizer_json_unchanged'] = all(
        open(os.path.join(s, 'tokenizer.json'), 'rb').read() == open(os.path.join(d, 'tokenizer.json'), 'rb').read()
        for s, d in ((src_t, dst_t), (src_d, dst_d)))
    tgt = AutoModelForCausalLM.from_pretrained(dst_t, dtype=torch.bfloat16).to(DEV).eval()
    drf = AutoModelForCausalLM.from_pretrained(dst_d, dtype=torch.bfloat16).to(DEV).eval()
    tt.SEQ = 512
    tt.HARD_END = time.time() + 100000
    ev = {'target': {}, 'draft': {}}
    guarded('losses', tt.ev_losses, ev, tgt, drf, val_text, res_val)
    for name, m in (('target', tgt), ('draft', drf)):
        ev[name]['heldout_tool_completion_loss'] = guarded('tool_loss', completion_loss, m, tool_val)
    guarded('samples', tt.ev_samples, ev, tgt, drf, hf_tok)
    sel = tt.select_heldout_prompts(chats[1])
    gens = {}
    guarded('format_checks', tt.ev_format, ev, tgt, drf, hf_tok, sel, gens)
    guarded('speculative', tt.ev_speculative, ev, tgt, drf, hf_tok, sel, gens)
    guarded('tool_eval', tool_eval, ev, tgt, drf, hf_tok, select_tool_eval(tools_va))
    guarded('tool_samples', tool_samples, ev, tgt, hf_tok)
    R['eval'] = ev
    write_eval(dst_t, dst_d)
    del tgt, drf
    torch.cuda.empty_cache()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gdir = os.path.join(WORK, 'golden')
    os.makedirs(gdir, exist_ok=True)
    guarded('golden_target', hf_goldens.golden_one, 'tern-demo', dst_t, {'repo_model': 'models/tern-demo'}, gdir, DEV)
    guarded('golden_draft', hf_goldens.golden_one, 'tern-demo-draft', dst_d,
            {'repo_model': 'models/tern-demo-draft'}, gdir, DEV)
    write_eval(dst_t, dst_d)
    tt.pack_to_out('target', WORK, tt.folder_files(WORK, 'tern-demo'))
    extra = ['template_hf.jsonl'] if os.path.isfile(os.path.join(WORK, 'template_hf.jsonl')) else []
    tt.pack_to_out('draft', WORK, tt.folder_files(WORK, 'tern-demo-draft') + tt.folder_files(WORK, 'golden') + extra)


def write_eval(dst_t, dst_d):
    with open(os.path.join(WORK, 'eval.json'), 'w', encoding='utf-8') as f:
        json.dump(R, f, indent=2, ensure_ascii=False)
        f.write('\n')
    shutil.copy(os.path.join(WORK, 'eval.json'), os.path.join(OUT, 'eval.json'))


if __name__ == '__main__':
    try:
        main()
        log('ALL DONE in %.1fs' % (time.time() - T0))
    except Exception:
        log('FAILED\n' + traceback.format_exc())
        try:
            write_eval(os.path.join(WORK, 'tern-demo'), os.path.join(WORK, 'tern-demo-draft'))
        except Exception:
            pass
        sys.exit(1)

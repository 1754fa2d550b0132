// tern chat page: talks to this server's /v1/chat/completions with streaming
// (Server-Sent Events read from fetch), a stop button (aborts the request,
// which closes the connection and cancels the generation in the engine), and
// a few settings kept in localStorage. A thinking model's thought
// (delta.reasoning_content) is shown collapsed above the answer. No
// external resources.
'use strict';

const $ = (id) => document.getElementById(id);
const els = {
  messages: $('messages'), input: $('input'), send: $('send'), stop: $('stop'), status: $('status'),
  model: $('model-name'), pick: $('model-pick'), settings: $('settings'), toggle: $('toggle-settings'), newChat: $('new-chat'),
  system: $('system-prompt'), temperature: $('temperature'), maxTokens: $('max-tokens'), apiKey: $('api-key'),
};

const history = []; // {role, content}
let controller = null;
let modelId = null;

// ---- settings ----
const SETTINGS = ['system', 'temperature', 'maxTokens', 'apiKey'];
function loadSettings() {
  try {
    const s = JSON.parse(localStorage.getItem('tern.settings') || '{}');
    for (const k of SETTINGS) if (typeof s[k] === 'string') els[k].value = s[k];
  } catch (_) { /* fresh profile */ }
}
function saveSettings() {
  const s = {};
  for (const k of SETTINGS) s[k] = els[k].value;
  try { localStorage.setItem('tern.settings', JSON.stringify(s)); } catch (_) { /* private mode */ }
}
function headers() {
  const h = { 'Content-Type': 'application/json' };
  if (els.apiKey.value) h.Authorization = 'Bearer ' + els.apiKey.value;
  return h;
}

// ---- view ----
function addMessage(role, text) {
  const empty = els.messages.querySelector('.empty');
  if (empty) empty.remove();
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  div.textContent = text;
  els.messages.appendChild(div);
  els.messages.scrollTop = els.messages.scrollHeight;
  return div;
}
// An assistant reply: a collapsed thought (shown once one arrives) and the answer.
function addReply() {
  const div = addMessage('assistant', '');
  const thought = document.createElement('details');
  thought.className = 'thought';
  thought.hidden = true;
  const summary = document.createElement('summary');
  summary.textContent = 'Thinking…';
  const body = document.createElement('div');
  body.className = 'thought-text';
  thought.append(summary, body);
  const answer = document.createElement('span');
  answer.className = 'answer';
  div.append(thought, answer);
  return { div, thought, summary, body, answer };
}
function showEmpty() {
  els.messages.innerHTML = '';
  const p = document.createElement('p');
  p.className = 'empty';
  p.textContent = 'Ask something to start. Everything runs on this machine.';
  els.messages.appendChild(p);
}
function setBusy(busy) {
  els.send.disabled = busy;
  els.stop.disabled = !busy;
  els.status.textContent = busy ? 'generating…' : '';
}

async function loadModel() {
  try {
    const r = await fetch('/v1/models', { headers: headers() });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : r.statusText);
    // ?model=ID picks one of a pool's models (the desktop app's picker); else the first
    const want = new URLSearchParams(location.search).get('model');
    if (want && !j.data.some((m) => m.id === want)) throw new Error(`no model '${want}' here`);
    modelId = want || j.data[0].id;
    els.model.textContent = modelId;
    if (j.data.length > 1) showPicker(j.data);
  } catch (e) {
    els.model.textContent = '(model unavailable: ' + e.message + ')';
  }
}

// A server with several models (a pool): a picker; unloaded ones load when
// first used, failed ones cannot be picked. The choice is kept.
function showPicker(models) {
  let saved = null;
  try { saved = localStorage.getItem('tern.model'); } catch (_) { /* no storage */ }
  els.pick.textContent = '';
  for (const m of models) {
    const o = document.createElement('option');
    o.value = m.id;
    o.textContent = m.state && m.state !== 'loaded' ? `${m.id} (${m.state})` : m.id;
    o.disabled = m.state === 'failed';
    if (m.reason) o.title = m.reason;
    els.pick.appendChild(o);
  }
  const usable = models.filter((m) => m.state !== 'failed');
  const want = new URLSearchParams(location.search).get('model'); // ?model=ID wins over the saved choice
  const pick = usable.find((m) => m.id === want) || usable.find((m) => m.id === saved) ||
    usable.find((m) => m.state === 'loaded') || usable[0];
  if (pick) els.pick.value = pick.id;
  modelId = pick ? pick.id : null;
  els.pick.hidden = false;
  els.model.hidden = true;
  els.pick.onchange = () => {
    modelId = els.pick.value;
    try { localStorage.setItem('tern.model', modelId); } catch (_) { /* no storage */ }
  };
}

// ---- streaming ----
// Reads "data: ..." events from a fetch body; calls onEvent(jsonOrDone).
async function readSSE(body, onEvent) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  history.push({ role: 'user', content: text });
  addMessage('user', text);
  const reply = addReply();
  const out = reply.div;
  out.classList.add('streaming');
  setBusy(true);
  controller = new AbortController();
  const messages = [];
  if (els.system.value.trim()) messages.push({ role: 'system', content: els.system.value.trim() });
  messages.push(...history);
  const temperature = Number(els.temperature.value);
  const maxTokens = parseInt(els.maxTokens.value, 10);
  const req = { messages, stream: true, stream_options: { include_usage: true } };
  if (modelId) req.model = modelId;
  if (Number.isFinite(temperature)) req.temperature = temperature;
  if (Number.isFinite(maxTokens) && maxTokens > 0) req.max_tokens = maxTokens;
  let text_out = '', thought_out = '', finish = null, usage = null, stopped = false;
  try {
    const r = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(), body: JSON.stringify(req), signal: controller.signal });
    if (!r.ok) {
      let msg = r.statusText;
      try { const j = await r.json(); msg = j.error.message; } catch (_) { /* not JSON */ }
      throw new Error(`${r.status}: ${msg}`);
    }
    await readSSE(r.body, (ev) => {
      if (ev.error) throw new Error(ev.error.message);
      if (ev.usage) usage = ev.usage;
      for (const c of ev.choices || []) {
        const d = c.delta || {};
        if (d.reasoning_content) { thought_out += d.reasoning_content; reply.body.textContent = thought_out; reply.thought.hidden = false; }
        if (d.content) { text_out += d.content; reply.answer.textContent = text_out; reply.summary.textContent = 'Thought'; }
        if (d.reasoning_content || d.content) els.messages.scrollTop = els.messages.scrollHeight;
        if (c.finish_reason) finish = c.finish_reason;
      }
    });
  } catch (e) {
    if (e.name === 'AbortError') stopped = true;
    else { addMessage('error', String(e.message || e)); }
  } finally {
    controller = null;
    reply.summary.textContent = 'Thought';
    out.classList.remove('streaming');
    setBusy(false);
  }
  history.push({ role: 'assistant', content: text_out });
  const meta = document.createElement('span');
  meta.className = 'meta';
  meta.textContent = stopped ? 'stopped' : [finish && finish !== 'stop' ? 'finish: ' + finish : null, usage ? `${usage.completion_tokens} tokens` : null].filter(Boolean).join(' · ');
  if (meta.textContent) out.appendChild(meta);
  out.dataset.done = stopped ? 'stopped' : 'finished';
}

// ---- wiring ----
els.toggle.addEventListener('click', () => {
  const open = els.settings.hidden;
  els.settings.hidden = !open;
  els.toggle.setAttribute('aria-expanded', String(open));
});
for (const k of SETTINGS) els[k].addEventListener('change', () => { saveSettings(); if (k === 'apiKey') loadModel(); });
els.newChat.addEventListener('click', () => { if (controller) controller.abort(); history.length = 0; showEmpty(); });
els.stop.addEventListener('click', () => { if (controller) controller.abort(); });
$('composer').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = els.input.value.trim();
  if (!text || controller) return;
  els.input.value = '';
  send(text);
});
els.input.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); $('composer').requestSubmit(); }
});

loadSettings();
showEmpty();
loadModel();

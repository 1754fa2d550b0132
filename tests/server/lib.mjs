// Shared helpers of the server's script tests: start `tern serve` on a free
// loopback port (--port 0; the URL is read from its "serving ... on" line),
// stop it, and tiny assertion/reporting utilities. Node 20, no dependencies.
import { spawn } from 'node:child_process';
import path from 'node:path';
import fs from 'node:fs';

export const ROOT = process.env.TERN_ROOT || path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
export const BIN = process.env.TERN_BIN || path.join(ROOT, 'build', 'tern');
export const BUILD = process.env.TERN_BUILD || path.join(ROOT, 'build');
export const MODEL = path.join(ROOT, 'models', 'tern-demo');

// Extra arguments for every server the tests start, from the environment
// (e.g. TERN_SERVE_ARGS='--device cuda' runs the same scripts on a GPU).
export const SERVE_ARGS = (process.env.TERN_SERVE_ARGS || '').split(/\s+/).filter(Boolean);

// Starts the server (on the demo model, another model folder, or - model
// null - only what extraArgs name, e.g. a pool's --models DIR); resolves
// to {url, port, proc, log(), stop()}. spawnOpts go to child_process.spawn
// (e.g. {uid, gid}).
export function startServer(extraArgs = [], { timeoutMs = 60000, model = MODEL, spawnOpts = {} } = {}) {
  return new Promise((resolve, reject) => {
    const args = ['serve', ...(model ? [model] : []), '--host', '127.0.0.1', '--port', '0', ...extraArgs, ...SERVE_ARGS];
    const proc = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'], ...spawnOpts });
    let log = '';
    let done = false;
    const timer = setTimeout(() => {
      if (!done) { done = true; proc.kill('SIGKILL'); reject(new Error('server did not start in time:\n' + log)); }
    }, timeoutMs);
    const onData = (d) => {
      log += d.toString();
      const m = log.match(/serving \S+ on (http:\/\/[^\s]+:(\d+))/);
      if (m && !done) {
        done = true;
        clearTimeout(timer);
        const exited = new Promise((res) => proc.on('exit', (code, sig) => res({ code, sig })));
        resolve({
          url: m[1], port: Number(m[2]), proc,
          log: () => log,
          async stop() {
            if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
            const t = setTimeout(() => proc.kill('SIGKILL'), 15000);
            const r = await exited;
            clearTimeout(t);
            return r;
          },
        });
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => {
      if (!done) { done = true; clearTimeout(timer); reject(new Error(`server exited (${code}) before ready:\n${log}`)); }
    });
  });
}

let failures = 0, passes = 0;
export function check(cond, what, detail) {
  if (cond) { passes++; return true; }
  failures++;
  console.error(`FAIL: ${what}${detail !== undefined ? ' -- ' + (typeof detail === 'string' ? detail : JSON.stringify(detail)) : ''}`);
  return false;
}
export function summary(name) {
  console.log(`${name}: ${passes} passed, ${failures} failed`);
  return failures === 0 ? 0 : 1;
}

// Resident memory of a process in KiB (Linux).
export function rssKiB(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = s.match(/VmRSS:\s+(\d+)/);
  return m ? Number(m[1]) : 0;
}

// Reads an SSE body into the list of data payloads (strings).
export function parseSSE(text) {
  const out = [];
  for (const block of text.split('\n\n')) {
    if (!block.trim()) continue;
    for (const line of block.split('\n')) if (line.startsWith('data: ')) out.push(line.slice(6));
  }
  return out;
}

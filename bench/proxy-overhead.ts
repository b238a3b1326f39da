/**
 * Proxy overhead: the same load, in one run, against
 *   direct  — one fake OpenAI backend,
 *   nginx   — nginx `least_conn` + upstream keepalive over the two backends (the baseline),
 *   sluice  — Sluice (`src/cli.ts serve`) with a pool of the same two backends,
 * for JSON chat completions and SSE streams. Prints req/s, p50 and p99 per target and the
 * Sluice/nginx and Sluice/direct ratios; writes bench/results/proxy-overhead.json.
 *
 *   npx tsx bench/proxy-overhead.ts [--quick] [--targets direct,nginx,sluice] [--modes json,sse]
 *        [--concurrency 32] [--duration S] [--loadgen wrk|autocannon] [--nginx-workers 1] [--keep-tmp]
 *
 * Everything runs on 127.0.0.1 and every process started here is killed at the end, even on error.
 * The backends are this same file run with `--backend PORT NAME`, each in its own process.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createNetServer } from 'node:net';
import { createRequire } from 'node:module';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, closeSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const HOST = '127.0.0.1';
const SCRIPT = fileURLToPath(import.meta.url);
const REPO_ROOT = resolve(dirname(SCRIPT), '..');
const MODEL = 'bench-model';
const SLUICE_READY_TIMEOUT_MS = 20_000;

type Target = 'direct' | 'nginx' | 'sluice';
type Mode = 'json' | 'sse';
type LoadGen = 'wrk' | 'autocannon';

// ================================================================================================
// Fake backend (child process)

/** Tokens of an SSE answer; a few chunks, a short gap between them like a fast model. */
const SSE_TOKENS = ['Hello', ' from', ' the', ' backend'];
const SSE_CHUNK_GAP_MS = 2;

function runBackend(port: number, name: string): void {
  let inFlight = 0;
  let served = 0;
  let seq = 0;

  const metricsPage = (): string =>
    [
      '# HELP vllm:num_requests_waiting Number of requests waiting to be processed.',
      '# TYPE vllm:num_requests_waiting gauge',
      `vllm:num_requests_waiting{model_name="${MODEL}"} 0.0`,
      '# HELP vllm:num_requests_running Number of requests in model execution batches.',
      '# TYPE vllm:num_requests_running gauge',
      `vllm:num_requests_running{model_name="${MODEL}"} ${inFlight}.0`,
      '# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.',
      '# TYPE vllm:kv_cache_usage_perc gauge',
      `vllm:kv_cache_usage_perc{model_name="${MODEL}"} 0.1`,
      '',
    ].join('\n');

  const chunk = (id: string, delta: object, finish: string | null, usage?: object): string =>
    `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 0, model: MODEL, choices: usage ? [] : [{ index: 0, delta, finish_reason: finish }], ...(usage ? { usage } : {}) })}\n\n`;

  const handleCompletion = (body: string, res: ServerResponse): void => {
    let request: { stream?: boolean; stream_options?: { include_usage?: boolean } } = {};
    try {
      request = JSON.parse(body) as typeof request;
    } catch {
      res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":{"message":"bad json"}}');
      return;
    }
    const id = `chatcmpl-${name}-${++seq}`;
    inFlight++;
    const done = (): void => {
      inFlight--;
      served++;
    };
    const usage = { prompt_tokens: 8, completion_tokens: SSE_TOKENS.length, total_tokens: 8 + SSE_TOKENS.length };
    if (request.stream !== true) {
      res.writeHead(200, { 'content-type': 'application/json', 'x-inference-pod': name });
      res.end(
        JSON.stringify({
          id,
          object: 'chat.completion',
          created: 0,
          model: MODEL,
          choices: [{ index: 0, message: { role: 'assistant', content: `hi from ${name}` }, finish_reason: 'stop' }],
          usage,
        }),
      );
      done();
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-inference-pod': name });
    let i = 0;
    const timer = setInterval(() => {
      if (i < SSE_TOKENS.length) {
        res.write(chunk(id, i === 0 ? { role: 'assistant', content: SSE_TOKENS[i] } : { content: SSE_TOKENS[i] }, null));
        i++;
        return;
      }
      clearInterval(timer);
      let tail = chunk(id, {}, 'stop');
      if (request.stream_options?.include_usage === true) tail += chunk(id, {}, null, usage);
      res.end(`${tail}data: [DONE]\n\n`);
      done();
    }, SSE_CHUNK_GAP_MS);
    res.on('close', () => {
      if (!res.writableEnded) {
        clearInterval(timer);
        done();
      }
    });
  };

  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const url = req.url ?? '/';
    if (req.method === 'GET') {
      req.resume();
      if (url === '/metrics') res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(metricsPage());
      else if (url === '/health') res.writeHead(200).end();
      else if (url === '/v1/models')
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data: [{ id: MODEL, object: 'model', owned_by: name }] }));
      else if (url === '/bench/stats') res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ served, inFlight }));
      else res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"not found"}}');
      return;
    }
    if (req.method === 'POST' && url.startsWith('/v1/chat/completions')) {
      const parts: Buffer[] = [];
      req.on('data', (c: Buffer) => parts.push(c));
      req.on('end', () => handleCompletion(Buffer.concat(parts).toString('utf8'), res));
      return;
    }
    req.resume();
    res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"not found"}}');
  });
  server.keepAliveTimeout = 60_000;
  server.listen(port, HOST, () => process.stdout.write(`listening ${port}\n`));

  // Do not outlive the bench if it dies without cleaning up (our parent becomes init).
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) process.exit(0);
  }, 1000).unref();
  process.on('SIGTERM', () => process.exit(0));
}

// ================================================================================================
// Process management

interface Managed {
  name: string;
  child: ChildProcess;
  logFile: string;
}

const managed: Managed[] = [];

function startProcess(name: string, command: string, args: string[], logFile: string, cwd = REPO_ROOT): Managed {
  const fd = openSync(logFile, 'a');
  // Own process group, so a multi-process child (nginx master + worker) can be stopped as a whole.
  const child = spawn(command, args, { cwd, stdio: ['ignore', fd, fd], detached: true });
  closeSync(fd);
  const entry = { name, child, logFile };
  managed.push(entry);
  return entry;
}

function exited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

function signalGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // already gone
  }
}

async function stopAll(): Promise<void> {
  const alive = managed.filter((m) => !exited(m.child));
  for (const m of alive) signalGroup(m.child, 'SIGTERM');
  const deadline = Date.now() + 3000;
  while (alive.some((m) => !exited(m.child)) && Date.now() < deadline) await sleep(50);
  // The group kill also reaches nginx workers whose master is already gone.
  for (const m of managed) signalGroup(m.child, 'SIGKILL');
  managed.length = 0;
}

function logTail(file: string, lines = 20): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createNetServer();
    server.once('error', reject);
    server.listen(0, HOST, () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}

/** Polls `url` until it answers 200, the process exits, or the time runs out. */
async function waitForOk(url: string, timeoutMs: number, proc?: Managed): Promise<{ ok: true } | { ok: false; reason: string }> {
  const deadline = Date.now() + timeoutMs;
  let last = 'no answer yet';
  while (Date.now() < deadline) {
    if (proc !== undefined && exited(proc.child)) {
      return { ok: false, reason: `${proc.name} exited (code ${proc.child.exitCode ?? proc.child.signalCode}) before it was ready` };
    }
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1000) });
      await res.arrayBuffer();
      if (res.status === 200) return { ok: true };
      last = `HTTP ${res.status}`;
    } catch (err) {
      last = (err as Error).message;
    }
    await sleep(100);
  }
  return { ok: false, reason: `not ready after ${timeoutMs / 1000} s (last: ${last})` };
}

// ================================================================================================
// Targets

function requestBody(mode: Mode): string {
  return JSON.stringify({
    model: MODEL,
    messages: [{ role: 'user', content: 'Say hello.' }],
    max_tokens: 16,
    ...(mode === 'sse' ? { stream: true, stream_options: { include_usage: true } } : {}),
  });
}

function nginxConfig(dir: string, port: number, backends: number[], workers: number): string {
  const runAsRoot = process.getuid?.() === 0;
  return `# generated by bench/proxy-overhead.ts
daemon off;
master_process on;
worker_processes ${workers};
${runAsRoot ? 'user root;  # workers must write the temp paths in our private dir' : ''}
pid ${dir}/nginx.pid;
error_log ${dir}/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/client_body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  # Same connection reuse as a Node server (no per-connection request limit), so we compare proxies, not defaults.
  keepalive_requests 1000000;
  keepalive_timeout 60s;
  upstream llm {
    least_conn;
${backends.map((p) => `    server ${HOST}:${p};`).join('\n')}
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen ${HOST}:${port};
    location / {
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`;
}

function sluiceConfig(port: number, metricsPort: number, backends: number[]): string {
  return `# generated by bench/proxy-overhead.ts
server:
  host: ${HOST}
  port: ${port}
  metricsPort: ${metricsPort}
pool:
  name: bench-pool
  endpoints:
${backends.map((p, i) => `  - name: backend-${i}\n    address: ${HOST}\n    port: ${p}`).join('\n')}
`;
}

/** One JSON and one SSE request through the target, so we never benchmark an error page. */
async function probe(baseUrl: string): Promise<string | undefined> {
  for (const mode of ['json', 'sse'] as const) {
    try {
      const res = await fetch(`${baseUrl}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: requestBody(mode),
        signal: AbortSignal.timeout(5000),
      });
      const text = await res.text();
      if (res.status !== 200) return `${mode} probe: HTTP ${res.status} ${text.slice(0, 200)}`;
      if (mode === 'json' && !text.includes('hi from')) return `json probe: unexpected body ${text.slice(0, 200)}`;
      if (mode === 'sse' && !text.includes('data: [DONE]')) return `sse probe: stream did not end with [DONE]: ${text.slice(0, 200)}`;
    } catch (err) {
      return `${mode} probe failed: ${(err as Error).message}`;
    }
  }
  return undefined;
}

// ================================================================================================
// Load generation

interface LoadResult {
  requests: number;
  seconds: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  meanMs: number;
  /** Non-2xx answers plus connection/read/time-out errors. */
  errors: number;
}

const WRK_SCRIPT = `
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("BENCH_BODY")
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKJSON {\\"requests\\":%d,\\"duration_us\\":%d,\\"p50_us\\":%d,\\"p99_us\\":%d,\\"mean_us\\":%f,\\"errors\\":%d}\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.mean,
    e.connect + e.read + e.write + e.status + e.timeout))
end
`;

async function runWrk(url: string, body: string, concurrency: number, seconds: number, threads: number, scriptFile: string): Promise<LoadResult> {
  const args = [`-t${threads}`, `-c${concurrency}`, `-d${seconds}s`, '--timeout', '10s', '-s', scriptFile, url];
  const child = spawn('wrk', args, { env: { ...process.env, BENCH_BODY: body }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  const entry: Managed = { name: 'wrk', child, logFile: '' };
  managed.push(entry);
  let out = '';
  child.stdout?.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (out += c.toString()));
  const code = await new Promise<number | null>((r) => child.on('close', r));
  managed.splice(managed.indexOf(entry), 1);
  const line = out.split('\n').find((l) => l.startsWith('WRKJSON '));
  if (code !== 0 || line === undefined) throw new Error(`wrk failed (exit ${code}):\n${out}`);
  const r = JSON.parse(line.slice('WRKJSON '.length)) as { requests: number; duration_us: number; p50_us: number; p99_us: number; mean_us: number; errors: number };
  const secs = r.duration_us / 1e6;
  return { requests: r.requests, seconds: secs, rps: r.requests / secs, p50Ms: r.p50_us / 1000, p99Ms: r.p99_us / 1000, meanMs: r.mean_us / 1000, errors: r.errors };
}

/** The part of autocannon's programmatic API used here (the package ships no types). Its latencies are whole milliseconds, hence wrk by default. */
interface AutocannonResult {
  requests: { total: number };
  latency: { p50: number; p99: number; mean: number };
  duration: number;
  non2xx: number;
  errors: number;
  timeouts: number;
}
type Autocannon = (opts: {
  url: string;
  method: string;
  headers: Record<string, string>;
  body: string;
  connections: number;
  duration: number;
}) => Promise<AutocannonResult>;

async function runAutocannon(url: string, body: string, concurrency: number, seconds: number): Promise<LoadResult> {
  const autocannon = createRequire(import.meta.url)('autocannon') as Autocannon;
  const r = await autocannon({ url, method: 'POST', headers: { 'content-type': 'application/json' }, body, connections: concurrency, duration: seconds });
  return {
    requests: r.requests.total,
    seconds: r.duration,
    rps: r.requests.total / r.duration,
    p50Ms: r.latency.p50,
    p99Ms: r.latency.p99,
    meanMs: r.latency.mean,
    errors: r.non2xx + r.errors + r.timeouts,
  };
}

// ================================================================================================
// Main

interface RunRecord extends LoadResult {
  target: Target;
  mode: Mode;
  /** Share of the requests each backend served during the run (load-balancing check). */
  backendShare: number[];
}

interface Options {
  quick: boolean;
  targets: Target[];
  modes: Mode[];
  concurrency: number;
  seconds: number;
  warmupSeconds: number;
  loadgen: LoadGen;
  wrkThreads: number;
  nginxWorkers: number;
  keepTmp: boolean;
}

function parseOptions(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      quick: { type: 'boolean', default: false },
      targets: { type: 'string', default: 'direct,nginx,sluice' },
      modes: { type: 'string', default: 'json,sse' },
      concurrency: { type: 'string', default: '32' },
      duration: { type: 'string' },
      loadgen: { type: 'string' },
      'wrk-threads': { type: 'string', default: '1' },
      'nginx-workers': { type: 'string', default: '1' },
      'keep-tmp': { type: 'boolean', default: false },
    },
    strict: true,
  });
  const list = <T extends string>(raw: string, allowed: readonly T[], what: string): T[] => {
    const items = raw.split(',').map((s) => s.trim()).filter(Boolean);
    for (const item of items) if (!allowed.includes(item as T)) throw new Error(`unknown ${what} '${item}' (allowed: ${allowed.join(', ')})`);
    return items as T[];
  };
  const positive = (raw: string, what: string): number => {
    const n = Number(raw);
    if (!Number.isFinite(n) || n <= 0) throw new Error(`--${what} must be a positive number, got '${raw}'`);
    return n;
  };
  const quick = values.quick ?? false;
  const hasWrk = spawnSync('wrk', ['-v']).error === undefined;
  const loadgen = (values.loadgen ?? (hasWrk ? 'wrk' : 'autocannon')) as LoadGen;
  if (loadgen !== 'wrk' && loadgen !== 'autocannon') throw new Error(`--loadgen must be wrk or autocannon`);
  if (loadgen === 'wrk' && !hasWrk) throw new Error('wrk is not installed (apt-get install -y wrk), use --loadgen autocannon');
  const seconds = values.duration !== undefined ? positive(values.duration, 'duration') : quick ? 3 : 10;
  return {
    quick,
    targets: list(values.targets ?? '', ['direct', 'nginx', 'sluice'] as const, 'target'),
    modes: list(values.modes ?? '', ['json', 'sse'] as const, 'mode'),
    concurrency: Math.round(positive(values.concurrency ?? '32', 'concurrency')),
    seconds: loadgen === 'wrk' ? Math.max(1, Math.round(seconds)) : seconds,
    warmupSeconds: quick ? 1 : 2,
    loadgen,
    wrkThreads: Math.round(positive(values['wrk-threads'] ?? '1', 'wrk-threads')),
    nginxWorkers: Math.round(positive(values['nginx-workers'] ?? '1', 'nginx-workers')),
    keepTmp: values['keep-tmp'] ?? false,
  };
}

async function backendServed(ports: number[]): Promise<number[]> {
  return Promise.all(
    ports.map(async (p) => {
      const res = await fetch(`http://${HOST}:${p}/bench/stats`);
      return ((await res.json()) as { served: number }).served;
    }),
  );
}

function fmt(n: number, digits = 2): string {
  return Number.isFinite(n) ? n.toFixed(digits) : '-';
}

function printTable(runs: RunRecord[]): void {
  const header = ['mode', 'target', 'req/s', 'p50 ms', 'p99 ms', 'mean ms', 'errors', 'backend share'];
  const rows = runs.map((r) => [
    r.mode,
    r.target,
    fmt(r.rps, 0),
    fmt(r.p50Ms),
    fmt(r.p99Ms),
    fmt(r.meanMs),
    String(r.errors),
    r.backendShare.map((s) => `${Math.round(s * 100)}%`).join('/'),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]?.length ?? 0)));
  const line = (cells: string[]): string => cells.map((c, i) => (i < 2 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join('  ');
  console.log(line(header));
  for (const row of rows) console.log(line(row));
}

interface Ratio {
  mode: Mode;
  of: string;
  throughput: number;
  p50: number;
  p99: number;
}

function ratios(runs: RunRecord[]): Ratio[] {
  const out: Ratio[] = [];
  const pairs: Array<[Target, Target]> = [
    ['sluice', 'nginx'],
    ['sluice', 'direct'],
    ['nginx', 'direct'],
  ];
  for (const mode of ['json', 'sse'] as const) {
    for (const [a, b] of pairs) {
      const ra = runs.find((r) => r.mode === mode && r.target === a);
      const rb = runs.find((r) => r.mode === mode && r.target === b);
      if (ra === undefined || rb === undefined) continue;
      out.push({ mode, of: `${a}/${b}`, throughput: ra.rps / rb.rps, p50: ra.p50Ms / rb.p50Ms, p99: ra.p99Ms / rb.p99Ms });
    }
  }
  return out;
}

async function main(): Promise<number> {
  const opts = parseOptions(process.argv.slice(2));
  const tmp = mkdtempSync(join(tmpdir(), 'sluice-bench-'));
  const skipped: Record<string, string> = {};
  const runs: RunRecord[] = [];
  const urls = new Map<Target, string>();

  const cleanup = async (): Promise<void> => {
    await stopAll();
    if (!opts.keepTmp) rmSync(tmp, { recursive: true, force: true });
    else console.log(`temp files kept in ${tmp}`);
  };
  const onSignal = (signal: NodeJS.Signals): void => {
    console.error(`\n${signal}: stopping everything`);
    void cleanup().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  try {
    console.log(
      `proxy overhead: ${opts.loadgen}, ${opts.concurrency} connections, ${opts.seconds} s per run (+${opts.warmupSeconds} s warm-up), ` +
        `modes ${opts.modes.join(',')}, ${cpus().length} CPUs, node ${process.version}`,
    );

    // --- backends
    const backendPorts = [await freePort(), await freePort()];
    const backends = backendPorts.map((port, i) =>
      startProcess(`backend-${i}`, process.execPath, ['--import', 'tsx', SCRIPT, '--backend', String(port), `backend-${i}`], join(tmp, `backend-${i}.log`)),
    );
    for (const [i, b] of backends.entries()) {
      const ready = await waitForOk(`http://${HOST}:${backendPorts[i]}/health`, 15_000, b);
      if (!ready.ok) throw new Error(`${b.name}: ${ready.reason}\n${logTail(b.logFile)}`);
    }
    if (opts.targets.includes('direct')) urls.set('direct', `http://${HOST}:${backendPorts[0]}`);

    // --- nginx
    if (opts.targets.includes('nginx')) {
      if (spawnSync('nginx', ['-v']).error !== undefined) {
        skipped.nginx = 'nginx is not installed (apt-get install -y --no-install-recommends nginx-light)';
        console.log(`nginx: skipped — ${skipped.nginx}`);
      } else {
        const port = await freePort();
        const confFile = join(tmp, 'nginx.conf');
        writeFileSync(confFile, nginxConfig(tmp, port, backendPorts, opts.nginxWorkers));
        const proc = startProcess('nginx', 'nginx', ['-p', tmp, '-e', join(tmp, 'nginx-error.log'), '-c', confFile], join(tmp, 'nginx.log'));
        const base = `http://${HOST}:${port}`;
        const ready = await waitForOk(`${base}/health`, 10_000, proc);
        const problem = ready.ok ? await probe(base) : ready.reason;
        if (problem === undefined) urls.set('nginx', base);
        else {
          skipped.nginx = `nginx did not work: ${problem}`;
          console.log(`nginx: skipped — ${skipped.nginx}\n${logTail(join(tmp, 'nginx-error.log'))}`);
        }
      }
    }

    // --- sluice
    if (opts.targets.includes('sluice')) {
      const cli = join(REPO_ROOT, 'src', 'cli.ts');
      if (!existsSync(cli)) {
        skipped.sluice = `${cli} does not exist yet`;
        console.log(`sluice: skipped — ${skipped.sluice}`);
      } else {
        const [port, metricsPort] = [await freePort(), await freePort()];
        const confFile = join(tmp, 'sluice.yaml');
        writeFileSync(confFile, sluiceConfig(port, metricsPort, backendPorts));
        const proc = startProcess(
          'sluice',
          process.execPath,
          ['--import', 'tsx', cli, 'serve', '--config', confFile, '--log-level', 'warn'],
          join(tmp, 'sluice.log'),
        );
        const ready = await waitForOk(`http://${HOST}:${metricsPort}/ready`, SLUICE_READY_TIMEOUT_MS, proc);
        const base = `http://${HOST}:${port}`;
        const problem = ready.ok ? await probe(base) : `did not become ready on :${metricsPort}/ready — ${ready.reason}`;
        if (problem === undefined) urls.set('sluice', base);
        else {
          skipped.sluice = `Sluice ${problem}`;
          console.log(`sluice: NOT MEASURED — ${skipped.sluice}\n--- sluice log (tail) ---\n${logTail(proc.logFile)}\n---`);
        }
      }
    }

    // --- load
    const wrkScript = join(tmp, 'post.lua');
    writeFileSync(wrkScript, WRK_SCRIPT);
    const load = (url: string, body: string, seconds: number): Promise<LoadResult> =>
      opts.loadgen === 'wrk'
        ? runWrk(url, body, opts.concurrency, seconds, opts.wrkThreads, wrkScript)
        : runAutocannon(url, body, opts.concurrency, seconds);

    for (const mode of opts.modes) {
      for (const target of ['direct', 'nginx', 'sluice'] as const) {
        const base = urls.get(target);
        if (base === undefined) continue;
        const url = `${base}/v1/chat/completions`;
        const body = requestBody(mode);
        process.stdout.write(`  ${mode} → ${target} … `);
        await load(url, body, opts.warmupSeconds);
        const before = await backendServed(backendPorts);
        const result = await load(url, body, opts.seconds);
        const after = await backendServed(backendPorts);
        const deltas = after.map((a, i) => a - (before[i] ?? 0));
        const total = deltas.reduce((s, d) => s + d, 0);
        runs.push({ target, mode, ...result, backendShare: deltas.map((d) => (total > 0 ? d / total : 0)) });
        console.log(`${fmt(result.rps, 0)} req/s, p50 ${fmt(result.p50Ms)} ms, p99 ${fmt(result.p99Ms)} ms${result.errors ? `, ${result.errors} ERRORS` : ''}`);
      }
    }

    // --- report
    console.log('');
    printTable(runs);
    const ratioList = ratios(runs);
    if (ratioList.length > 0) {
      console.log('\nratios (throughput: higher is better for the first; latency: lower is better)');
      for (const r of ratioList) {
        console.log(`  ${r.mode.padEnd(4)} ${r.of.padEnd(13)} throughput ×${fmt(r.throughput)}  p50 ×${fmt(r.p50)}  p99 ×${fmt(r.p99)}`);
      }
    }
    for (const [target, reason] of Object.entries(skipped)) console.log(`not measured: ${target} — ${reason}`);

    const resultsDir = join(REPO_ROOT, 'bench', 'results');
    mkdirSync(resultsDir, { recursive: true });
    const outFile = join(resultsDir, 'proxy-overhead.json');
    writeFileSync(
      outFile,
      `${JSON.stringify(
        {
          date: new Date().toISOString(),
          node: process.version,
          cpus: cpus().length,
          cpuModel: cpus()[0]?.model,
          options: { ...opts, keepTmp: undefined },
          backend: { sseChunks: SSE_TOKENS.length, sseChunkGapMs: SSE_CHUNK_GAP_MS },
          runs,
          ratios: ratioList,
          skipped,
        },
        null,
        2,
      )}\n`,
    );
    console.log(`\nwrote ${outFile}`);
    return runs.length > 0 ? 0 : 1;
  } finally {
    await cleanup();
  }
}

const argv = process.argv.slice(2);
if (argv[0] === '--backend') {
  runBackend(Number(argv[1]), argv[2] ?? `backend-${argv[1]}`);
} else {
  main().then(
    (code) => process.exit(code),
    (err: unknown) => {
      console.error(`proxy-overhead failed: ${err instanceof Error ? err.message : String(err)}`);
      process.exit(1);
    },
  );
}

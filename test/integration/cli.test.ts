/** The `sluice` binary as a user runs it: validate, serve + SIGTERM, demo. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import net from 'node:net';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import OpenAI from 'openai';
import { DEMO_LONG_PROMPT, startDemo } from '../../src/demo.js';
import { startFakeBackend } from '../helpers/fake-backend.js';
import { exitCodeAfter, until } from '../helpers/wait.js';
import { CLI, spawnCli } from '../helpers/cli-process.js';


/** Runs the CLI to its end; `env` is laid over ours, an undefined value taking the variable away. */
function run(args: string[], env: Record<string, string | undefined> = {}) {
  const merged = { ...process.env, ...env };
  for (const [k, v] of Object.entries(env)) if (v === undefined) delete merged[k];
  return new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    const p = spawn(process.execPath, ['--import', 'tsx', CLI, ...args], { env: merged });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c) => (stdout += c));
    p.stderr.on('data', (c) => (stderr += c));
    p.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

const dir = mkdtempSync(join(tmpdir(), 'sluice-cli-'));

describe('sluice CLI', () => {
  test('validate prints the effective config with injections; exit 0', async () => {
    const r = await run(['validate', '--config', join(import.meta.dirname, '../../config/single-pool.yaml')]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /single-profile-handler/);
    assert.match(r.stdout, /max-score-picker/);
    assert.match(r.stdout, /utilization-detector/);
  });

  test('validate on a bad file prints FILE:LINE:COL: path: message lines; exit 1', async () => {
    const file = join(dir, 'bad.yaml');
    writeFileSync(file, 'server:\n  metricPort: 9090\npool:\n  endpoints: []\n');
    const at = new RegExp(`${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:2:3: server.metricPort: .*did you mean "metricsPort"`);
    const r = await run(['validate', '--config', file]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, at);
    // serve reports the same and starts nothing
    const served = await run(['serve', '--config', file]);
    assert.equal(served.code, 1);
    assert.match(served.stderr, at);
  });

  test('validate into a pipe read late: the whole output arrives (stdout and stderr), with its exit code', async () => {
    // Far more than a pipe holds (64 KiB), read only after a while, as by a slow `| less`.
    const lines = (bad: boolean) =>
      Array.from({ length: 3000 }, (_, i) => `  - { name: ep-${i}, address: 10.0.${i >> 8}.${i & 255}${bad ? ', port: x' : ''} }`).join('\n');
    for (const bad of [false, true]) {
      const file = join(dir, `big-${bad}.yaml`);
      writeFileSync(file, `pool:\n  endpoints:\n${lines(bad)}\n`);
      const out = join(dir, `out-${bad}`);
      // The problems are on stderr: that one goes into the pipe then.
      const redirect = bad ? '2>&1 >/dev/null' : '';
      const cmd = `"${process.execPath}" --import tsx "${CLI}" validate --config "${file}" ${redirect} | (sleep 1; cat > "${out}"); echo "\${PIPESTATUS[0]}"`;
      const r = await new Promise<string>((resolve) => {
        const p = spawn('bash', ['-c', cmd]);
        let stdout = '';
        p.stdout.on('data', (c) => (stdout += c));
        p.on('close', () => resolve(stdout.trim()));
      });
      if (bad) {
        assert.equal(r, '1');
        const problems = readFileSync(out, 'utf8');
        assert.equal(problems.split('\n').filter((l) => l.includes('.port: ')).length, 3000, `${problems.length} bytes of problems`);
      } else {
        assert.equal(r, '0');
        assert.equal(readFileSync(out, 'utf8').match(/name: ep-/g)?.length, 3000, `${readFileSync(out, 'utf8').length} bytes of output`);
      }
    }
  });

  test('version and --version print the package version; --help the usage; exit 0', async () => {
    const { version } = JSON.parse(readFileSync(join(import.meta.dirname, '../../package.json'), 'utf8')) as { version: string };
    for (const args of [['version'], ['--version']]) {
      const r = await run(args);
      assert.equal(r.code, 0, `${args[0]}: ${r.stderr}`);
      assert.equal(r.stdout.trim(), version, args[0]);
    }
    const help = await run(['--help']);
    assert.equal(help.code, 0);
    assert.match(help.stdout, /sluice version \| --version/);
    // The environment and the exit codes are in the help too, not only in the docs.
    for (const said of [/SLUICE_CONFIG=FILE/, /LOG_LEVEL=L/, /exit codes +0 clean stop, 1 bad configuration or arguments, 2 runtime failure/]) assert.match(help.stdout, said);
    // Each command's --help prints the usage and starts nothing (the demo would take ports 8080 and up).
    for (const command of ['serve', 'validate', 'demo', 'sim']) {
      const r = await run([command, '--help']);
      assert.equal(r.code, 0, `${command} --help: ${r.stderr}`);
      assert.match(r.stdout, /^usage:/, command);
    }
    assert.match((await run(['sim', '--help'])).stdout, /--max-num-seqs N +requests running at once .*\[8\]/);
    assert.match((await run(['help'])).stdout, /^usage:/);
    // Each command's own help: what it does and its flags.
    assert.match((await run(['serve', '--help'])).stdout, /^usage: sluice serve [^]*--metrics-port N +the metrics port, over server\.metricsPort/);
    assert.match((await run(['help', 'validate'])).stdout, /^usage: sluice validate --config FILE\n\nPrints the effective configuration/);
    assert.match((await run(['help', 'sim'])).stdout, /^usage: sluice sim [^]*--max-num-seqs N +requests running at once/);
    assert.match((await run(['help', 'version'])).stdout, /^usage: sluice version/);
    assert.match((await run(['version', '--help'])).stdout, /^usage: sluice version/);
    // A stray flag or an unknown topic is an argument error, as for every other command.
    const stray = await run(['version', '--bogus']);
    assert.equal(stray.code, 1);
    assert.match(stray.stderr, /^sluice: version: Unknown option '--bogus'/);
    const unknownTopic = await run(['help', 'bogus']);
    assert.equal(unknownTopic.code, 1);
    assert.match(unknownTopic.stderr, /^sluice: help: unknown command 'bogus'\nusage:/);
    assert.match((await run(['demo', '-h'])).stdout, /^usage: sluice demo [^]*Ctrl-C stops it/);
    // Bare: without SLUICE_CONFIG (what the image sets, to serve), the usage and exit 1.
    const bare = await run([], { SLUICE_CONFIG: undefined });
    assert.equal(bare.code, 1);
    assert.match(bare.stderr, /^sluice: no command given\nusage:/);
  });

  test("sim says where it listens in the gateway's log format (pino JSON), and stops on SIGTERM", async () => {
    const sim = spawnCli(['sim', '--port', '0', '--model', 'm-1']);
    const { p } = sim;
    try {
      const line = await sim.listening<{ level: number; msg: string; url: string; model: string }>();
      assert.equal(line.level, 30);
      assert.equal(line.msg, 'simulator listening');
      assert.equal(line.model, 'm-1');
      assert.equal((await request(`${line.url}/health`)).statusCode, 200);
      const code = await exitCodeAfter(p, 'SIGTERM');
      assert.equal(code, 0);
    } finally {
      p.kill('SIGKILL');
    }
  });

  test('SLUICE_CONFIG stands for --config; unknown command exits 1', async () => {
    const r = await run(['validate'], { SLUICE_CONFIG: join(import.meta.dirname, '../../config/demo.yaml') });
    assert.equal(r.code, 0, r.stderr);
    const bad = await run(['frobnicate']);
    assert.equal(bad.code, 1);
  });

  test('bad arguments exit 1 with a message naming them, before anything starts', async () => {
    const config = join(import.meta.dirname, '../../config/single-pool.yaml');
    const cases: [string[], Record<string, string>, RegExp][] = [
      [['serve', '--config', config, '--port', 'abc'], {}, /--port must be a port number \(0-65535\), got 'abc'/],
      [['serve', '--config', config, '--metrics-port', '70000'], {}, /--metrics-port must be a port number/],
      // Number() would read these as 0 (any free port), 8080 and 1000.
      [['serve', '--config', config, '--port', ''], {}, /--port must be a port number \(0-65535\), got ''/],
      [['serve', '--config', config, '--port', '0x1F90'], {}, /--port must be a port number/],
      [['serve', '--config', config, '--metrics-port', '1e3'], {}, /--metrics-port must be a port number/],
      [['serve', '--config', config, '--log-level', 'bogus'], {}, /--log-level must be one of .*debug.*, got 'bogus'/],
      [['serve', '--config', config], { LOG_LEVEL: 'loud' }, /LOG_LEVEL must be one of .*, got 'loud'/],
      [['serve', '--config', config, '--bogus'], {}, /Unknown option '--bogus'/],
      [['serve', '--config', config, '--port', '19411', '--metrics-port', '19411'], {}, /the API port and the metrics port must differ \(both 19411/],
      [['serve', '--config', config, '--port', '9090'], {}, /the API port and the metrics port must differ \(both 9090/],
      [['demo', '--metrics-port', '8080'], {}, /the API port and the metrics port must differ \(both 8080/],
      [['validate', '--config', config, '--port', '5'], {}, /validate: Unknown option '--port'/],
      [['demo', '--config', config], {}, /demo: Unknown option '--config'/],
      [['validate', config], {}, /validate: Unexpected argument '.*single-pool\.yaml'.*\(the configuration file is given as --config .*single-pool\.yaml\)/],
      [['sim', '--bogus', '1'], {}, /unknown flag --bogus/],
      [['sim', '--max-num-seqs', '-3'], {}, /--max-num-seqs must be an integer/],
    ];
    const results = await Promise.all(cases.map(([args, env]) => run(args, env)));
    results.forEach((r, i) => {
      const [args, env, message] = cases[i]!;
      const what = `${Object.entries(env).map(([k, v]) => `${k}=${v} `).join('')}${args.join(' ')}`;
      assert.equal(r.code, 1, `${what}: ${r.stderr}${r.stdout}`);
      assert.match(r.stderr, message, what);
    });
  });

  test('serve answers, then drains and exits 0 on SIGTERM; a busy port exits 2', async () => {
    const backend = await startFakeBackend();
    const file = join(dir, 'serve.yaml');
    writeFileSync(
      file,
      `server: { port: 0, metricsPort: 0 }\npool:\n  metrics: { interval: 20ms }\n  endpoints:\n  - { name: b, address: 127.0.0.1, port: ${backend.port} }\n`,
    );
    const gateway = spawnCli(['serve', '--config', file, '--log-level', 'info']);
    const { p } = gateway;
    try {
      const listening = await gateway.listening<{ apiPort: number; metricsPort: number; flowControl: string }>();
      assert.equal(listening.flowControl, 'on', "said at start: llm-d's default is off");
      const r = await request(`http://127.0.0.1:${listening.apiPort}/health`);
      assert.equal(r.statusCode, 200);
      await r.body.dump();
      // `serve` implied by a leading flag, the file from SLUICE_CONFIG: it gets as far as the busy port.
      const busy = await run(['--port', String(listening.apiPort)], { SLUICE_CONFIG: file });
      assert.equal(busy.code, 2, busy.stderr + busy.stdout);
      assert.match(busy.stderr + busy.stdout, new RegExp(`${listening.apiPort}`));
      const code = await exitCodeAfter(p, 'SIGTERM');
      assert.equal(code, 0);
    } finally {
      p.kill('SIGKILL');
      await backend.close();
    }
  });

  test("the demo with one of its fleet's ports (8101–8104) taken: the simulators listen on free ports and the demo answers", async () => {
    // Take 8102 (or find it taken already: the same case).
    const squatter = net.createServer();
    await new Promise<void>((resolve) => squatter.once('error', () => resolve()).listen(8102, '127.0.0.1', resolve));
    try {
      const demo = await startDemo({ port: 0, metricsPort: 0 });
      try {
        assert.ok(demo.sims.every((s) => s.port !== 8102), demo.sims.map((s) => s.port).join(' '));
        assert.deepEqual(demo.gateway.pool.endpoints.map((e) => e.port), demo.sims.map((s) => s.port));
        const client = new OpenAI({ baseURL: `${demo.gateway.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
        await until(() => demo.gateway.pool.endpoints.every((e) => e.metricsAt > 0), 5000, 'the fleet scraped');
        const res = await client.chat.completions.create({ model: demo.model, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(res.usage?.completion_tokens, 2);
      } finally {
        await demo.close();
      }
    } finally {
      squatter.close();
    }
  });

  test('the demo: simulated P/D-labelled fleet + gateway answers the openai client, short prompts decode-only, long ones P/D', async () => {
    const demo = await startDemo({ port: 0, metricsPort: 0, anyFleetPorts: true });
    try {
      const roles = demo.gateway.pool.endpoints.map((e) => e.role).sort();
      assert.deepEqual(roles, ['decode', 'decode', 'prefill', 'prefill']);
      const client = new OpenAI({ baseURL: `${demo.gateway.apiUrl}/v1`, apiKey: 'x', maxRetries: 0 });
      const deadline = Date.now() + 5000;
      while (!demo.gateway.pool.endpoints.every((e) => e.metricsAt > 0) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      const res = await client.chat.completions.create({ model: demo.model, max_tokens: 3, messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(res.usage?.completion_tokens, 3);
      const prefillLegs = () => demo.sims.reduce((n, s) => n + s.engine.counters.requestSuccess.remote_decode, 0);
      assert.equal(prefillLegs(), 0, 'a short prompt is decode-only');
      // The banner's long prompt, streamed: prefilled on a prefill pod, decoded on a decode pod.
      const stream = await client.chat.completions.create({
        model: demo.model,
        max_tokens: 3,
        stream: true,
        messages: [{ role: 'user', content: DEMO_LONG_PROMPT }],
      });
      let tokens = 0;
      for await (const c of stream) if (c.choices[0]?.delta?.content) tokens++;
      assert.equal(tokens, 3);
      assert.equal(prefillLegs(), 1);
      const prefillSim = demo.sims.find((s) => s.engine.counters.requestSuccess.remote_decode === 1);
      assert.match(prefillSim?.name ?? '', /^prefill-/);
      const metrics = await (await request(`${demo.gateway.metricsUrl}/metrics`)).body.text();
      assert.match(metrics, /llm_d_epp_disagg_decision_total\{model_name="sim-model",decision_type="prefill-decode"\} 1/);
      assert.match(metrics, /llm_d_epp_disagg_decision_total\{model_name="sim-model",decision_type="decode-only"\} 1/);
      // README's Responses API conversation: the second turn goes back to the decode pod that stored the first.
      const first = await client.responses.create({ model: demo.model, input: DEMO_LONG_PROMPT, max_output_tokens: 2 });
      const next = await client.responses.create({ model: demo.model, input: 'How long is it?', previous_response_id: first.id, max_output_tokens: 2 });
      assert.equal(next.previous_response_id, first.id);
      assert.ok((next.usage?.input_tokens_details.cached_tokens ?? 0) > 0, 'the conversation so far was cached there');
    } finally {
      await demo.close();
    }
  });
});

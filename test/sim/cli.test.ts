import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { parseSimArgs, simUsage } from '../../src/sim/cli.js';

describe('parseSimArgs', () => {
  test('reads every flag, in both --flag value and --flag=value forms', () => {
    const opts = parseSimArgs([
      '--port', '8123', '--host=0.0.0.0', '--name', 'pod-1', '--model', 'meta/llama',
      '--max-num-seqs', '4', '--max-waiting=10', '--ttft-overhead-ms', '12.5', '--prefill-ms-per-token', '0.2',
      '--itl-ms', '3', '--block-size', '32', '--num-gpu-blocks', '2048', '--default-output-tokens', '8',
      '--failure-rate', '0.1', '--failure-status', '503', '--max-model-len', '4096',
    ]);
    assert.deepEqual(opts, {
      port: 8123, host: '0.0.0.0', name: 'pod-1', model: 'meta/llama', maxNumSeqs: 4, maxWaiting: 10,
      ttftOverheadMs: 12.5, prefillMsPerToken: 0.2, itlMs: 3, blockSizeTokens: 32, numGpuBlocks: 2048,
      defaultOutputTokens: 8, failureRate: 0.1, failureStatus: 503, maxModelLen: 4096,
    });
    assert.deepEqual(parseSimArgs([]), {});
    assert.deepEqual(parseSimArgs(['--max-model-len=0']), { maxModelLen: 0 }, '0 = no limit');
  });

  test('unknown flags, bad numbers and missing values throw errors naming the flag', () => {
    assert.throws(() => parseSimArgs(['--bogus', '1']), /--bogus/);
    assert.throws(() => parseSimArgs(['--port', 'abc']), /--port/);
    // Plain decimal only, as serve's --port: not hex, exponents or padding that Number() would take.
    for (const v of ['0x10', '1e3', ' 8000', '']) assert.throws(() => parseSimArgs(['--port', v]), /--port must be an integer/, JSON.stringify(v));
    assert.deepEqual(parseSimArgs(['--port', '8001', '--itl-ms', '2.5']), { port: 8001, itlMs: 2.5 });
    assert.throws(() => parseSimArgs(['--max-num-seqs', '2.5']), /--max-num-seqs/);
    assert.throws(() => parseSimArgs(['--max-num-seqs', '0']), /--max-num-seqs/);
    assert.throws(() => parseSimArgs(['--failure-rate', '5']), /--failure-rate/);
    assert.throws(() => parseSimArgs(['--max-model-len', '-1']), /--max-model-len/);
    assert.throws(() => parseSimArgs(['--itl-ms', '']), /--itl-ms/);
    assert.throws(() => parseSimArgs(['--itl-ms']), /--itl-ms needs a value/);
    assert.throws(() => parseSimArgs(['--name', '--port', '1']), /--name needs a value/);
    assert.throws(() => parseSimArgs(['stray']), /stray/);
  });
});

describe("parseSimArgs: llm-d-inference-sim's flag names", () => {
  test('each sets the same option as its Sluice flag; durations as Go strings or integer milliseconds', () => {
    assert.deepEqual(
      parseSimArgs([
        '--served-model-name', 'meta/llama', '--max-waiting-queue-length=20', '--prefill-overhead', '15ms',
        '--prefill-time-per-token', '100us', '--inter-token-latency', '7', '--kv-cache-transfer-latency', '1.5s',
        '--kv-cache-transfer-time-per-token', '20us', '--kv-cache-size', '512', '--failure-injection-rate', '25',
        '--enable-kvcache', '--max-num-seqs', '5',
      ]),
      {
        model: 'meta/llama', maxWaiting: 20, ttftOverheadMs: 15, prefillMsPerToken: 0.1, itlMs: 7, kvTransferMs: 1500,
        kvTransferMsPerToken: 0.02, numGpuBlocks: 512, failureRate: 0.25, maxNumSeqs: 5,
      },
    );
  });

  test('--time-to-first-token is a constant time to first token unless a per-token cost is given', () => {
    assert.deepEqual(parseSimArgs(['--time-to-first-token', '200ms']), { ttftOverheadMs: 200, prefillMsPerToken: 0 });
    assert.deepEqual(parseSimArgs(['--time-to-first-token=50ms', '--prefill-ms-per-token', '0.2']), { ttftOverheadMs: 50, prefillMsPerToken: 0.2 });
  });

  test('a setting given twice, under one name or two, is an error naming both', () => {
    assert.throws(() => parseSimArgs(['--itl-ms', '3', '--inter-token-latency', '5ms']), /--inter-token-latency sets what --itl-ms already set/);
    assert.throws(() => parseSimArgs(['--time-to-first-token', '1s', '--ttft-overhead-ms', '3']), /--ttft-overhead-ms sets what --time-to-first-token already set/);
    assert.throws(() => parseSimArgs(['--port', '1', '--port', '2']), /--port is given twice/);
  });

  test('--served-model-name given with --model is the name served (llm-d: --model is the model loaded)', () => {
    assert.deepEqual(parseSimArgs(['--model', 'meta/llama-3', '--served-model-name', 'llama']), { model: 'llama' });
    assert.deepEqual(parseSimArgs(['--served-model-name=llama', '--model', 'meta/llama-3']), { model: 'llama' });
  });

  test('--name is visible ASCII: it goes into a header and into every answer', () => {
    for (const bad of ['pod-日本', 'pod 1', 'pod\n']) assert.throws(() => parseSimArgs(['--name', bad]), /--name must be visible ASCII/, bad);
    assert.deepEqual(parseSimArgs(['--name', 'pod-"a"']), { name: 'pod-"a"' });
  });

  test('bad values name the flag', () => {
    assert.throws(() => parseSimArgs(['--inter-token-latency', '1.5']), /--inter-token-latency: invalid duration "1.5": missing unit/);
    assert.throws(() => parseSimArgs(['--inter-token-latency', '-5ms']), /--inter-token-latency: invalid duration "-5ms": must not be negative/);
    assert.throws(() => parseSimArgs(['--failure-injection-rate', '150']), /--failure-injection-rate must be a number in \[0, 100\]/);
    assert.throws(() => parseSimArgs(['--enable-kvcache=false']), /--enable-kvcache: sluice sim always models the prefix cache/);
    assert.throws(() => parseSimArgs(['--mode', 'echo']), /unknown flag --mode/);
  });

  test('--help shows every flag with its default, and the llm-d names with the flag they stand for', () => {
    const help = simUsage();
    assert.match(help, /--itl-ms MS +inter-token latency \[5\]/);
    assert.match(help, /--max-model-len N +.*\[131072\]/);
    assert.match(help, /--port N +.*\[8000\]/);
    assert.match(help, /--inter-token-latency DURATION += --itl-ms/);
    for (const line of help.split('\n').filter((l) => l.startsWith('  --'))) {
      const flag = line.trim().split(' ')[0]!;
      if (flag === '--enable-kvcache') continue;
      if (flag === '--enable-responses-store') {
        assert.deepEqual(parseSimArgs([flag]), { responsesStore: true }, 'a switch: it takes no value');
        continue;
      }
      // Every flag listed parses (value placeholders replaced by something valid for it).
      const value = /DURATION/.test(line) ? '1ms' : /(HOST|NAME|MODEL)/.test(line) ? 'x' : /CODE/.test(line) ? '500' : '1';
      assert.doesNotThrow(() => parseSimArgs([flag, value]), line);
    }
  });
});

describe("parseSimArgs: vLLM's Responses API store", () => {
  test('--enable-responses-store turns it on; else VLLM_ENABLE_RESPONSES_API_STORE as vLLM reads it (an integer); the flag wins', () => {
    assert.deepEqual(parseSimArgs(['--enable-responses-store']), { responsesStore: true });
    assert.deepEqual(parseSimArgs([], { VLLM_ENABLE_RESPONSES_API_STORE: '1' }), { responsesStore: true });
    assert.deepEqual(parseSimArgs([], { VLLM_ENABLE_RESPONSES_API_STORE: '0' }), { responsesStore: false });
    assert.deepEqual(parseSimArgs([], {}), {}, 'off by default, as vLLM');
    assert.deepEqual(parseSimArgs(['--enable-responses-store'], { VLLM_ENABLE_RESPONSES_API_STORE: '0' }), { responsesStore: true });
    assert.throws(() => parseSimArgs([], { VLLM_ENABLE_RESPONSES_API_STORE: 'yes' }), /VLLM_ENABLE_RESPONSES_API_STORE must be an integer/);
    assert.throws(() => parseSimArgs(['--enable-responses-store', '--enable-responses-store']), /given twice/);
    assert.throws(() => parseSimArgs(['--enable-responses-store=1']), /takes no value/);
    assert.match(simUsage(), /--enable-responses-store +keep Responses API answers .*VLLM_ENABLE_RESPONSES_API_STORE=1.*\[off\]/);
  });
});

describe('runSimCli', () => {
  test('logs its URL, serves, and exits 0 on SIGTERM', async () => {
    const cliModule = fileURLToPath(new URL('../../src/sim/cli.ts', import.meta.url));
    const child = spawn(process.execPath, [
      '--import', 'tsx', '--input-type=module', '-e',
      `const { runSimCli } = await import(${JSON.stringify(cliModule)}); await runSimCli(['--port', '0', '--name', 'cli-pod']);`,
    ], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      let out = '';
      child.stdout.setEncoding('utf8');
      while (!out.includes('\n')) {
        const [chunk] = (await once(child.stdout, 'data')) as [string];
        out += chunk;
      }
      const line = JSON.parse(out.split('\n')[0]!) as { url: string; name: string };
      assert.equal(line.name, 'cli-pod');
      const health = await fetch(line.url + '/health');
      assert.equal(health.status, 200);
      assert.equal(health.headers.get('x-inference-pod'), 'cli-pod');
      child.kill('SIGTERM');
      const [code] = (await once(child, 'exit')) as [number | null];
      assert.equal(code, 0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });
});

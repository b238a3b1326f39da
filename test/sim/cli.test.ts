import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { parseSimArgs } from '../../src/sim/cli.js';

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

/**
 * Scrape-parse micro-benchmark: what reading one model server's `/metrics` page costs the gateway's
 * event loop (`extractVllmMetrics`, as the scraper calls it on every scrape, ~20 times a second per
 * endpoint at the default 50 ms interval).
 *
 * Pages: the test fixture (a few families), a page the size of a busy vLLM's (the fixture plus 40
 * histograms of 30 buckets the gateway does not read), and LoRA pages with 1 000 / 10 000 / 30 000
 * `vllm:lora_requests_info` series (vLLM keeps one per adapter combination it has run; Sluice builds
 * the labels of the newest only). Strings are flat, as a decoded HTTP body is.
 *
 *   npx tsx bench/scrape-parse.ts [--quick]
 *
 * Writes bench/results/scrape-parse.json.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { extractVllmMetrics } from '../src/datalayer/vllm-metrics.js';

const QUICK = process.argv.includes('--quick');
const MIN_MS = QUICK ? 200 : 1_000;
const here = dirname(fileURLToPath(import.meta.url));
const fixture = readFileSync(join(here, '..', 'test', 'fixtures', 'vllm-metrics.txt'), 'utf8');

function histograms(families: number, buckets: number): string {
  const lines: string[] = [];
  for (let f = 0; f < families; f++) {
    const name = `vllm:unread_histogram_${f}_seconds`;
    lines.push(`# HELP ${name} A histogram the gateway does not read.`, `# TYPE ${name} histogram`);
    for (let b = 0; b < buckets; b++) lines.push(`${name}_bucket{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",le="${(b + 1) * 0.05}"} ${b * 7}`);
    lines.push(`${name}_bucket{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",le="+Inf"} ${buckets * 7}`);
    lines.push(`${name}_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123.5`, `${name}_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} ${buckets * 7}`);
  }
  return lines.join('\n') + '\n';
}

function loraSeries(count: number): string {
  const lines = ['# HELP vllm:lora_requests_info Running stats on lora requests.', '# TYPE vllm:lora_requests_info gauge'];
  for (let i = 0; i < count; i++) {
    lines.push(`vllm:lora_requests_info{max_lora="8",running_lora_adapters="adapter-${i % 97},adapter-${i % 13}",waiting_lora_adapters="adapter-${i % 31}"} ${1.7e9 + i}`);
  }
  return lines.join('\n') + '\n';
}

/** A flat copy (concatenation makes a rope, which V8 flattens on first read: not what a body is). */
const flat = (s: string): string => Buffer.from(s, 'utf8').toString('utf8');

interface PageResult {
  page: string;
  bytes: number;
  parses: number;
  medianMs: number;
  minMs: number;
}

function time(page: string, text: string): PageResult {
  for (let i = 0; i < 5; i++) extractVllmMetrics(text);
  const samples: number[] = [];
  const start = performance.now();
  while (performance.now() - start < MIN_MS || samples.length < 10) {
    const t0 = performance.now();
    extractVllmMetrics(text);
    samples.push(performance.now() - t0);
  }
  samples.sort((a, b) => a - b);
  return { page, bytes: Buffer.byteLength(text), parses: samples.length, medianMs: samples[samples.length >> 1]!, minMs: samples[0]! };
}

const pages: [string, string][] = [
  ['fixture', fixture],
  ['busy vLLM (40 unread histograms)', fixture + histograms(40, 30)],
  ['LoRA, 1 000 series', fixture + loraSeries(1_000)],
  ['LoRA, 10 000 series', fixture + loraSeries(10_000)],
  ['LoRA, 30 000 series', fixture + loraSeries(30_000)],
];

console.log(`scrape-parse bench: extractVllmMetrics per page${QUICK ? ' [quick]' : ''}`);
console.log('page                                    bytes     parses   median ms   min ms');
const results: PageResult[] = [];
for (const [name, text] of pages) {
  const r = time(name, flat(text));
  results.push(r);
  console.log(`${name.padEnd(36)} ${String(r.bytes).padStart(9)} ${String(r.parses).padStart(10)} ${r.medianMs.toFixed(3).padStart(11)} ${r.minMs.toFixed(3).padStart(8)}`);
}
const out = join(here, 'results', 'scrape-parse.json');
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, JSON.stringify({ date: new Date().toISOString(), node: process.version, cpu: cpus()[0]?.model, quick: QUICK, results }, null, 2) + '\n');
console.log(`wrote ${out}`);

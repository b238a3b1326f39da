/**
 * Target verdicts, results.json and REPORT.md (+ SVG charts next to it) from the parts' results.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { PACED_TARGETS, type OverheadRatio, type OverheadResult, type PacedResults } from './overhead.js';
import type { QualityResult, RouterResult, StepResult } from './quality.js';
import type { ScaleResult } from './scale.js';
import { fmt, fmtInt, mb, mdTable } from './stats.js';
import { barChart, flameGraph, lineChart } from './svg.js';

export interface Meta {
  date: string;
  mode: 'quick' | 'full';
  only: string[];
  node: string;
  cpus: number;
  cpuModel: string;
  git: { head: string; dirty: boolean };
  loadAverageStart: number[];
  loadAverageEnd: number[];
  seconds: number;
  /** Content hash of src/*.ts when each part started: differing hashes = src changed during the run. */
  srcHashes: Record<string, string>;
}

export interface BenchResults {
  meta: Meta;
  overhead?: OverheadResult;
  quality?: QualityResult;
  scale?: ScaleResult;
  errors: Record<string, string>;
  targets: Verdict[];
}

export interface Verdict {
  id: string;
  target: string;
  value: string;
  /** null = not measured in this run, or (with `inconclusive`) measured but too noisy to decide. */
  met: boolean | null;
  inconclusive?: boolean;
  note?: string;
}

export const TARGETS = {
  throughputVsNginx: 0.6,
  addedP99Ms: 2,
  ttftP90VsRr: 0.5,
  qualityLoad: 0.8,
  shareOverMean: 1.5,
  queue100kMB: 300,
  sched64Us: 50,
  rssGrowthFraction: 0.05,
};

/** results.json text: JSON has no Infinity or NaN (a TTFT of a request that never answered is ∞), so they are written as strings. */
export function resultsJson(res: BenchResults): string {
  return JSON.stringify(res, (_k, v: unknown) => (typeof v === 'number' && !Number.isFinite(v) ? String(v) : v), 2) + '\n';
}

/** The inverse of resultsJson (for --report-only). */
export function parseResults(text: string): BenchResults {
  return JSON.parse(text, (_k, v: unknown) => (v === 'Infinity' ? Infinity : v === '-Infinity' ? -Infinity : v === 'NaN' ? NaN : v)) as BenchResults;
}

function stepAt(r: RouterResult | undefined, load: number): StepResult | undefined {
  return r?.steps.find((s) => Math.abs(s.load - load) < 1e-6);
}

export function evaluateTargets(res: Omit<BenchResults, 'targets'>): Verdict[] {
  const v: Verdict[] = [];
  const o = res.overhead;
  // 1. throughput ≥ 0.6 × nginx, each prompt/mode, with the Sluice config of that case.
  const cases: Array<[string, 'short' | '4kb', 'json' | 'sse', string]> = [
    ['1a', 'short', 'json', 'sluice'],
    ['1b', 'short', 'sse', 'sluice'],
    ['1c', '4kb', 'json', 'sluice-3s'],
    ['1d', '4kb', 'sse', 'sluice-3s'],
  ];
  for (const [id, c, mode, target] of cases) {
    const ratio = (of: string): OverheadRatio | undefined => o?.ratios.find((x) => x.case === c && x.mode === mode && x.of === of);
    const r = ratio(`${target}/nginx`);
    const floor = ratio('node-proxy/nginx');
    const ofFloor = ratio(`${target}/node-proxy`);
    const label = `${target === 'sluice' ? 'default config' : 'three-scorer profile'}, ${c === 'short' ? 'short' : '4 KB'} prompt, ${mode.toUpperCase()}`;
    v.push({
      id,
      target: `Sluice throughput ≥ ${TARGETS.throughputVsNginx} × nginx (${label})`,
      value: r
        ? `×${fmt(r.throughput)}` + (floor && ofFloor ? ` (a bare Node proxy reaches ×${fmt(floor.throughput)} of nginx; Sluice reaches ×${fmt(ofFloor.throughput)} of it)` : '')
        : 'not measured',
      met: r ? r.throughput >= TARGETS.throughputVsNginx : null,
    });
  }
  const p = o?.paced;
  const low = p?.low;
  const lowText =
    low?.sluice && low.direct
      ? `; at ${low.rateRps} req/s: p99 added ${fmt(low.sluice.latencyMs.p99 - low.direct.latencyMs.p99, 2)} ms, p50 added ${fmt(low.sluice.latencyMs.p50 - low.direct.latencyMs.p50, 2)} ms`
      : '';
  const target2 = `p99 added latency over direct ≤ ${TARGETS.addedP99Ms} ms at half of Sluice's max throughput`;
  const w = p?.wrk;
  if (w?.addedP99Ms !== undefined) {
    // Judged on wrk: the undici client's own event-loop stalls land in its tail (shown beside it).
    v.push({
      id: '2',
      target: target2,
      value:
        `${fmt(w.addedP99Ms, 2)} ms at ${fmtInt(p!.rateRps)} req/s (wrk, ${w.connections} connections with exponential think time; p99 ${fmt(w.sluice?.latencyMs.p99, 2)} vs ${fmt(w.direct?.latencyMs.p99, 2)} ms)` +
        (w.nodeAddedP99Ms !== undefined ? `; a bare Node proxy adds ${fmt(w.nodeAddedP99Ms, 2)} ms` : '') +
        (p!.addedP99Ms !== undefined ? `; the open-loop undici client measured ${fmt(p!.addedP99Ms, 2)} ms, its own stalls included` : '') +
        lowText,
      met: w.addedP99Ms <= TARGETS.addedP99Ms,
    });
  } else {
    // No wrk: the undici client's own lateness (p99) bounds the timing noise of the box; decide only
    // when the added p99 is clear of the target by more than that.
    const lag = Math.max(p?.direct?.sendLagMs.p99 ?? 0, p?.sluice?.sendLagMs.p99 ?? 0);
    const measured = p?.addedP99Ms !== undefined;
    const added = p?.addedP99Ms ?? NaN;
    const noisy = measured && Math.abs(added - TARGETS.addedP99Ms) <= lag;
    v.push({
      id: '2',
      target: target2,
      value: measured
        ? `${fmt(added, 2)} ms at ${fmtInt(p!.rateRps)} req/s (p99 ${fmt(p!.sluice?.latencyMs.p99, 2)} vs ${fmt(p!.direct?.latencyMs.p99, 2)} ms; the client ran up to ${fmt(lag, 1)} ms late, p99)` +
          (noisy ? ' — inconclusive: within the timing noise of this box' : '') +
          (p!.nodeAddedP99Ms !== undefined ? `; a bare Node proxy adds ${fmt(p!.nodeAddedP99Ms, 2)} ms at p99 in the same rounds` : '') +
          lowText
        : 'not measured',
      met: measured && !noisy ? added <= TARGETS.addedP99Ms : null,
      ...(noisy ? { inconclusive: true } : {}),
    });
  }
  const q = res.quality;
  const sl = stepAt(q?.routers.find((r) => r.router === 'sluice'), TARGETS.qualityLoad);
  const rr = stepAt(q?.routers.find((r) => r.router === 'nginx-rr'), TARGETS.qualityLoad);
  const ratio = sl && rr ? sl.ttftMs.p90 / rr.ttftMs.p90 : NaN;
  // The TTFT-tuned profile, for information: the target is the default profile's.
  const tuned = stepAt(q?.routers.find((r) => r.router === 'sluice-ttft'), TARGETS.qualityLoad);
  const tunedNote = tuned && rr ? ` (default profile; with queue-scorer ×3, sluice-ttft: ${fmt(tuned.ttftMs.p90, 0)} ms = ×${fmt(tuned.ttftMs.p90 / rr.ttftMs.p90)})` : '';
  v.push({
    id: '3',
    target: `Scheduling quality at 80 % load: Sluice p90 TTFT ≤ ${TARGETS.ttftP90VsRr} × nginx round-robin's`,
    value: sl && rr ? `${fmt(sl.ttftMs.p90, 0)} vs ${fmt(rr.ttftMs.p90, 0)} ms = ×${fmt(ratio)}${tunedNote}` : 'not measured',
    met: sl && rr ? ratio <= TARGETS.ttftP90VsRr : null,
  });
  const d = q?.distinct?.step;
  v.push({
    id: '4',
    target: `Distinct prompts: no instance's share above ${TARGETS.shareOverMean} × the mean`,
    value: d ? `max share = ×${fmt(d.maxShareOverMean)} of the mean (${d.share.map((s) => `${Math.round(s * 100)}%`).join('/')})` : 'not measured',
    met: d ? d.maxShareOverMean <= TARGETS.shareOverMean : null,
  });
  const s = res.scale;
  const fc = s?.flowcontrol?.depths.find((x) => x.depth === 100_000);
  const queue = s?.queue;
  const fcBytes = fc?.memory ? fc.memory.controllerBytes + fc.memory.requestBytes : NaN;
  const base = queue?.rssIdleMB;
  if (fc?.memory) {
    const total = (base ?? 0) + (fcBytes * 100_000) / 1048576;
    v.push({
      id: '5a',
      target: `100k queued requests under ${TARGETS.queue100kMB} MB RSS — flow controller (queue state + request record)`,
      value: `${fmt(fcBytes, 0)} B/request → ${fmt((fcBytes * 100_000) / 1048576, 1)} MB for 100k${base !== undefined ? ` (+ ${fmt(base, 0)} MB idle gateway = ${fmt(total, 0)} MB)` : ''}`,
      met: total < TARGETS.queue100kMB,
    });
  } else {
    v.push({ id: '5a', target: `100k queued requests under ${TARGETS.queue100kMB} MB RSS — flow controller`, value: 'not measured', met: null });
  }
  v.push({
    id: '5b',
    target: `100k queued requests under ${TARGETS.queue100kMB} MB RSS — whole gateway, one HTTP/1.1 connection per queued request`,
    value: queue
      ? `${fmtInt(queue.bytesPerQueuedRequest)} B RSS/request measured with ${fmtInt(queue.requests)} → ≈ ${fmt(queue.extrapolated100kMB, 0)} MB for 100k (extrapolated)` +
        (queue.baseline ? `; a bare node:http server holding the same requests: ${fmtInt(queue.baseline.bytesPerRequest)} B/request` : '') +
        (queue.tcpBaseline
          ? `; a bare net.Server holding the connections, no HTTP: ${fmtInt(queue.tcpBaseline.bytesPerRequest)} B/connection (100k ≈ ${fmt(mb(queue.tcpBaseline.bytesPerRequest * 100_000), 0)} MB before any HTTP or gateway state)`
          : '')
      : 'not measured',
    met: queue ? queue.extrapolated100kMB < TARGETS.queue100kMB : null,
    note: 'the container allows 20k open files per process, so 100k real connections cannot be held; extrapolated linearly',
  });
  const s64 = s?.sched?.find((x) => x.endpoints === 64);
  v.push({
    id: '6',
    target: `Scheduling 64 endpoints under ${TARGETS.sched64Us} µs (median per decision)`,
    value: s64 ? `${fmt(s64.medianUs, 1)} µs (p99 ${fmt(s64.p99Us, 1)} µs)` : 'not measured',
    met: s64 ? s64.medianUs < TARGETS.sched64Us : null,
  });
  const soak = s?.soak;
  if (soak) {
    const a = soak.gcStart;
    const b = soak.gcEnd;
    const growth = a && b ? b.rssMB - a.rssMB : soak.growthMB;
    const start = a ? a.rssMB : soak.startMB;
    const heapGrowth = a && b ? b.heapUsedMB - a.heapUsedMB : NaN;
    const ok = growth <= Math.max(5, start * TARGETS.rssGrowthFraction) && !(heapGrowth > 5);
    v.push({
      id: '7',
      target: `Gateway RSS after ${soak.requests >= 1_000_000 ? '1M' : `${fmtInt(soak.requests)} (quick run; full run: 1M)`} requests: no growth (≤ 5 % or 5 MB, after GC)`,
      value: a && b ? `after GC: RSS ${fmt(a.rssMB, 1)} → ${fmt(b.rssMB, 1)} MB, heap ${fmt(a.heapUsedMB, 1)} → ${fmt(b.heapUsedMB, 1)} MB` : `RSS ${fmt(soak.startMB, 1)} → ${fmt(soak.endMB, 1)} MB`,
      met: ok,
    });
  } else {
    v.push({ id: '7', target: 'Gateway RSS after 1M requests: no growth', value: 'not measured', met: null });
  }
  return v;
}

function verdictText(v: Verdict): string {
  return v.met === null ? (v.inconclusive ? 'inconclusive' : 'not measured') : v.met ? 'met' : 'NOT MET';
}

export function printVerdicts(vs: Verdict[], log: (l: string) => void): void {
  log('\ntargets (issue 7):');
  for (const v of vs) log(`  [${verdictText(v).padEnd(12)}] ${v.id.padEnd(3)} ${v.target}: ${v.value}`);
}

// ------------------------------------------------------------------------------------------------

function writeSvg(dir: string, name: string, svg: string, files: string[]): string {
  writeFileSync(join(dir, name), svg);
  files.push(name);
  return `![${name}](${name})`;
}

function ms(v: number, d = 0): string {
  return fmt(v, d);
}

/** One row per paced target: rate, outcomes, latency, and the gateway thread's CPU and run-queue shares. */
function pacedTable(results: PacedResults, withSendLag: boolean): string {
  const rows = PACED_TARGETS.filter((t) => results[t] !== undefined).map((t) => {
    const r = results[t]!;
    const g = r.gateway;
    return [
      t,
      fmtInt(r.achievedRps),
      String(r.completed),
      String(r.errors),
      ms(r.latencyMs.p50, 3),
      ms(r.latencyMs.p90, 3),
      ms(r.latencyMs.p99, 3),
      ms(r.latencyMs.max, 1),
      ...(withSendLag ? [ms(r.sendLagMs.p99, 2)] : []),
      g ? `${fmt(g.cpuShare * 100, 0)} % / ${fmt(g.runQueueWaitShare * 100, 1)} %` : '',
    ];
  });
  const header = ['target', 'req/s sent', 'completed', 'errors', 'p50 ms', 'p90 ms', 'p99 ms', 'max ms', ...(withSendLag ? ['send lag p99 ms'] : []), 'gateway on CPU / waiting for a CPU'];
  return mdTable(header, rows, 1);
}

export function writeReport(res: BenchResults, dir: string): string[] {
  const files: string[] = [];
  const L: string[] = [];
  const m = res.meta;
  L.push(`# Sluice benchmark report (${m.mode})`);
  L.push('');
  L.push(
    `${m.date} · git ${m.git.head}${m.git.dirty ? ' (uncommitted changes)' : ''} · node ${m.node} · ${m.cpus} × ${m.cpuModel} · ` +
      `load average ${m.loadAverageStart.map((x) => x.toFixed(1)).join('/')} at start, ${m.loadAverageEnd.map((x) => x.toFixed(1)).join('/')} at the end · ${fmt(m.seconds / 60, 1)} min`,
  );
  L.push('');
  const hashes = Object.entries(m.srcHashes ?? {});
  if (new Set(hashes.map(([, h]) => h)).size > 1) {
    L.push(`> **src/ changed while this run was going** (content hash per part: ${hashes.map(([p, h]) => `${p} ${h}`).join(', ')}): parts with different hashes measured different code.`);
    L.push('');
  }
  L.push('Generated by `npm run bench' + (m.mode === 'full' ? ' -- --full' : '') + (m.only.length < 3 ? ` -- --only ${m.only.join(',')}` : '') + '`; every number is in `results.json`. ' +
    'The machine is shared: compare rows of the same run, not absolute numbers across runs.');
  L.push('');
  L.push('## Targets');
  L.push('');
  L.push(mdTable(['', 'target', 'this run', 'verdict'], res.targets.map((v) => [v.id, v.target + (v.note ? ` (${v.note})` : ''), v.value, v.met === null ? (v.inconclusive ? '❔ inconclusive' : 'not measured') : v.met ? '✅ met' : '❌ **not met**']), 4));
  L.push('');
  for (const [part, err] of Object.entries(res.errors)) L.push(`> **${part} failed:** ${err.split('\n')[0]}\n`);

  // ---------------------------------------------------------------- overhead
  const o = res.overhead;
  if (o) {
    L.push('## 1. Proxy overhead');
    L.push('');
    L.push(
      `Two fast fake backends (JSON answered at once; SSE = ${o.backend.sseChunks} chunks ${o.backend.sseChunkGapMs} ms apart). ` +
        `Closed loop with ${o.options.loadgen} at ${o.options.concurrency} connections: ${o.options.rounds ?? 1} rounds of ${o.options.seconds} s per target after ${o.options.warmupSeconds} s warm-up, the targets interleaved round by round; each row is the target's median round (all rounds in the last column). ` +
        '`direct` = backend 0 alone; `nginx` = least_conn + upstream keepalive 64, one worker; `node-proxy` = the least any Node gateway does (node:http server + undici pool, round robin, no parsing: Node\'s floor, bench/lib/node-proxy.ts); `sluice` = default config (queue ×2, kv ×2, prefix ×3, flow control on); ' +
        `\`sluice-3s\` = ${o.sluice3sProfile}. The short prompt is "Say hello."; the 4 KB prompt is a 4096-character user message made distinct per request from its first characters by wrk (so Sluice hashes and learns all 64 blocks each time and the prefix scorer has no affinity to pile identical prompts onto one backend).`,
    );
    L.push('');
    L.push(
      mdTable(
        ['prompt', 'mode', 'target', 'req/s', 'p50 ms', 'p99 ms', 'errors', 'backend share', 'gateway CPU µs/req', 'req/s of the rounds'],
        o.runs.map((r) => [
          r.case,
          r.mode,
          r.target,
          fmtInt(r.rps),
          fmt(r.p50Ms),
          fmt(r.p99Ms),
          String(r.errors),
          r.backendShare.map((s) => `${Math.round(s * 100)}%`).join(' / '),
          r.proxyCpuMsPerRequest !== undefined ? fmt(r.proxyCpuMsPerRequest * 1000, 0) : '',
          (r.roundsRps ?? []).map((x) => fmtInt(x)).join(' / '),
        ]),
        3,
      ),
    );
    L.push('');
    L.push('Ratios from the same run (throughput: higher is better for the first; latency: lower is better):');
    L.push('');
    L.push(mdTable(['prompt', 'mode', 'ratio', 'throughput', 'p50', 'p99'], o.ratios.map((r) => [r.case, r.mode, r.of, `×${fmt(r.throughput)}`, `×${fmt(r.p50)}`, `×${fmt(r.p99)}`]), 3));
    L.push('');
    const groups = ['short/json', 'short/sse', '4kb/json', '4kb/sse']
      .map((g) => {
        const [c, mode] = g.split('/') as ['short' | '4kb', 'json' | 'sse'];
        const get = (t: string): number => o.runs.find((r) => r.case === c && r.mode === mode && r.target === t)?.rps ?? NaN;
        return { label: g, values: [get('direct'), get('nginx'), get('node-proxy'), c === 'short' ? get('sluice') : get('sluice-3s')] };
      })
      .filter((g) => g.values.some(Number.isFinite));
    if (groups.length) {
      L.push(writeSvg(dir, 'overhead-throughput.svg', barChart({ title: 'Throughput at fixed concurrency (req/s)', yLabel: 'requests / s', series: ['direct', 'nginx least_conn', 'bare Node proxy', 'Sluice (default / 3-scorer)'], groups }), files));
      L.push('');
      const lat = groups.map((g) => {
        const [c, mode] = g.label.split('/') as ['short' | '4kb', 'json' | 'sse'];
        const get = (t: string): number => o.runs.find((r) => r.case === c && r.mode === mode && r.target === t)?.p99Ms ?? NaN;
        return { label: g.label, values: [get('direct'), get('nginx'), get('node-proxy'), c === 'short' ? get('sluice') : get('sluice-3s')] };
      });
      L.push(writeSvg(dir, 'overhead-p99.svg', barChart({ title: 'p99 latency at fixed concurrency (ms)', yLabel: 'ms', series: ['direct', 'nginx least_conn', 'bare Node proxy', 'Sluice (default / 3-scorer)'], groups: lat }), files));
      L.push('');
    }
    const p = o.paced;
    const rounds = `${o.options.pacedRounds} interleaved rounds of ${p.seconds} s per target, the median-p99 round shown`;
    const w = p.wrk;
    if (w && (w.direct || w.sluice)) {
      L.push(`### Added latency at half of Sluice's maximum (${fmtInt(p.rateRps)} req/s, JSON short prompt; ${rounds})`);
      L.push('');
      L.push(
        `wrk with ${w.connections} connections, each waiting an exponentially distributed think time before its next request, so that together they offer ` +
          'the rate above (a closed loop with think time: a request that answers late delays only its own connection\'s next one, so each target reaches the rate less its own latency, a few per cent). wrk is C: it costs the box ' +
          'little and never stops for a garbage collection, so its latency (send → whole answer, microsecond histogram) is the gateway\'s and the box\'s. ' +
          'The added-latency target is judged here.',
      );
      L.push('');
      L.push(pacedTable(w, false));
      L.push('');
      if (w.addedP99Ms !== undefined) L.push(`Sluice adds **${fmt(w.addedP50Ms, 3)} ms at p50 and ${fmt(w.addedP99Ms, 3)} ms at p99** over direct.`);
      if (w.nodeAddedP99Ms !== undefined) L.push(`The bare Node proxy (\`node-proxy\`, no scheduling) adds ${fmt(w.nodeAddedP99Ms, 3)} ms at p99 in the same rounds.`);
      L.push('');
    }
    if (p.direct || p.sluice) {
      L.push(`### ${w ? 'The same with an open-loop Node client' : `Added latency at half of Sluice's maximum (${fmtInt(p.rateRps)} req/s, open loop, JSON short prompt; ${rounds})`}`);
      L.push('');
      L.push(
        'A paced undici client sends at a fixed rate (wrk2 is not packaged); latency is measured per request with sub-millisecond resolution from the moment it is sent. ' +
          '"send lag" is how late the client sent against the schedule (timer granularity), the same for every target. ' +
          'The client is a Node process on the same two cores: its own event loop stops now and then (5–15 ms was measured on this box), and a response that arrives then is ' +
          'timed late — these tails are the client\'s as much as the gateway\'s' +
          (w ? '.' : ' (wrk was not found: the target is judged here, and an added p99 within the client\'s send lag reads inconclusive).'),
      );
      L.push('');
      L.push(pacedTable(p, true));
      L.push('');
      L.push(
        'The last column is the gateway\'s event-loop thread (/proc/PID/schedstat): the share of the round it ran, and the share it was ready to run while the ' +
          'load generator, the backends and the rest of the box held both cores — time no gateway code can win back.',
      );
      L.push('');
      if (p.addedP99Ms !== undefined) L.push(`Sluice adds **${fmt(p.addedP50Ms, 3)} ms at p50 and ${fmt(p.addedP99Ms, 3)} ms at p99** over direct.`);
      if (p.nodeAddedP99Ms !== undefined)
        L.push(
          `The bare Node proxy (\`node-proxy\`, no scheduling) adds ${fmt(p.nodeAddedP99Ms, 3)} ms at p99 in the same rounds: on this 2-core box, tails of tens of ms come and go in every ` +
            'process that needs a CPU (loopback TCP is processed in the same CPU time), so the p99 of a 2 s round swings with the box more than with the gateway — compare the rounds in `results.json`.',
        );
      L.push('');
      const low = p.low;
      if (low) {
        L.push(`At a low rate (${low.rateRps} req/s, ${low.seconds} s, nothing queues anywhere) — the fixed cost of each hop:`);
        L.push('');
        const lrows = PACED_TARGETS.filter((t) => low[t] !== undefined)
          .map((t) => {
            const r = low[t]!;
            const d = low.direct;
            return [t, ms(r.latencyMs.p50, 3), ms(r.latencyMs.p90, 3), ms(r.latencyMs.p99, 3), d ? ms(r.latencyMs.p50 - d.latencyMs.p50, 3) : '–', String(r.errors)];
          });
        L.push(mdTable(['target', 'p50 ms', 'p90 ms', 'p99 ms', 'p50 added over direct, ms', 'errors'], lrows, 1));
        L.push('');
      }
    }
    for (const [t, why] of Object.entries(o.skipped)) L.push(`> not measured: ${t} — ${why.split('\n')[0]}\n`);
    for (const [t, prof] of Object.entries(o.profiles ?? {})) {
      if (!prof) continue;
      L.push(`**CPU profile of ${t}** (\`node --cpu-prof\`, share of the process's busy (non-idle) time over its whole life — start-up, every run above, shutdown; ${fmt(prof.samplesMs / 1000, 1)} s busy):`);
      L.push('');
      L.push(mdTable(['function', 'self time'], prof.topFunctions.map((e) => [`\`${e.name}\``, `${fmt(e.share * 100, 1)} %`]), 1));
      L.push('');
      if (prof.flame && prof.flame.total > 0) {
        const title = `${t}: where its CPU time goes (${fmt(prof.samplesMs / 1000, 1)} s busy; hover a frame for its share)`;
        L.push(writeSvg(dir, `overhead-flame-${t}.svg`, flameGraph({ title, root: prof.flame }), files));
        L.push('');
      }
    }
  }

  // ---------------------------------------------------------------- quality
  const q = res.quality;
  if (q) {
    const s = q.options.sim;
    const w = q.options.workload;
    const c = q.capacity;
    L.push('## 2. Scheduling quality');
    L.push('');
    L.push(
      `**Fleet:** ${q.options.instances} × \`sluice sim\` (one process each): max-num-seqs ${s.maxNumSeqs}, TTFT = ${s.ttftOverheadMs} ms + ${s.prefillMsPerToken} ms per uncached prompt token, ` +
        `ITL ${s.itlMs} ms, prefix caching with ${s.numGpuBlocks} KV blocks of 16 tokens per instance (an LRU of block hashes).`,
    );
    L.push('');
    L.push(
      `**Workload:** many users sharing ${w.systemPrompts} system prompts of ${w.systemPromptChars} characters (≈${Math.round(w.systemPromptChars / 4)} tokens), each request with its own ${w.suffixChars}-character user message; ` +
        `${w.outputTokensMin}–${w.outputTokensMax} output tokens (uniform); streamed chat completions; Poisson arrivals; every router gets the identical request sequence on a fresh fleet ` +
        `(${q.options.warmupSeconds} s unrecorded warm-up at 50 %, then ${q.options.stepSeconds} s per step${q.options.targetStepSeconds ? ` (${q.options.targetStepSeconds} s at 80 %)` : ''}, ${q.options.drainSeconds} s to drain; requests still open then are aborted and count as failed with TTFT ∞).`,
    );
    L.push('');
    L.push(
      `**Why ${w.systemPrompts} prompts:** one instance's KV cache holds about ${Math.floor(s.numGpuBlocks / Math.ceil((w.systemPromptChars + w.suffixChars) / 64))} of them, the fleet's holds all. ` +
        'With fewer prompts than that, every instance caches every prompt whatever the router does, and the comparison measures queueing only. ' +
        '(The number of blocks cannot simply be lowered: `kv_cache_usage_perc` counts the blocks running requests hold, a prefix they share once, as vLLM does, ' +
        `so ${s.maxNumSeqs} running requests of different prompts of ≈${Math.ceil((w.systemPromptChars + w.suffixChars) / 64)} blocks hold ${s.maxNumSeqs} prompts' blocks: with a smaller cache, an instance serving several prompts would report itself saturated.)`,
    );
    L.push('');
    L.push(
      `**Capacity (100 %):** service time ${fmt(c.serviceMsCached, 0)} ms per request when its system prompt is cached (TTFT ${fmt(c.ttftMsCached, 0)} ms), ` +
        `${fmt(c.serviceMsUncached, 0)} ms when not (TTFT ${fmt(c.ttftMsUncached, 0)} ms) → fleet capacity ${fmt(c.fleetRps, 1)} req/s with perfect cache affinity ` +
        `(${fmt(c.fleetRpsUncached, 1)} req/s with none). Load steps are fractions of ${fmt(c.fleetRps, 1)} req/s.`,
    );
    L.push('');
    L.push(
      'TTFT is measured at the client: from sending the request to the first body byte (the simulator sends headers with the first token). ' +
        '"cache hit (tokens)" is the fleet\'s prefix-cache hit rate over the step (cached / queried prompt tokens, from the simulators\' `vllm:prefix_cache_*` counters); ' +
          '"requests missing" is the share of requests whose instance had less than half of the prompt cached (from each answer\'s usage chunk, `prompt_tokens_details.cached_tokens`), ' +
          'and the p90 TTFT of the two groups tells queueing (slow hits) from cache misses (slow misses). ' +
          '"instances per prompt" is how many instances answered at least 10 % of a system prompt\'s requests, averaged over the prompts: ' +
          'a prompt held by one or two instances queues behind their slots when its traffic bunches, one spread over more is pooled.',
    );
    L.push('');
    const rows: string[][] = [];
    for (const r of q.routers) {
      if (r.error) rows.push([r.router, '–', '–', '–', '–', '–', '–', '–', '–', '–', '–', '–', '–', `failed: ${r.error.split('\n')[0]}`]);
      for (const st of r.steps) {
        rows.push([
          r.router,
          `${Math.round(st.load * 100)}%`,
          fmt(st.rateRps, 1),
          ms(st.ttftMs.p50),
          ms(st.ttftMs.p90),
          ms(st.ttftMs.p99),
          fmt(st.completedRps, 1),
          `${fmt(st.cacheHitRate * 100, 0)}%`,
          `${fmt(st.missRate * 100, 0)}%`,
          ms(st.ttftHitMs.p90),
          ms(st.ttftMissMs.p90),
          fmt(st.instancesPerPrompt, 1),
          st.share.map((x) => `${Math.round(x * 100)}`).join('/'),
          `${st.errors + st.unfinished} of ${st.sent}`,
        ]);
      }
    }
    L.push(mdTable(['router', 'load', 'offered req/s', 'TTFT p50 ms', 'p90 ms', 'p99 ms', 'completed req/s', 'cache hit (tokens)', 'requests missing', 'p90 of hits ms', 'p90 of misses ms', 'instances per prompt', 'share per instance %', 'failed'], rows, 1));
    L.push('');
    const routers = q.routers.filter((r) => r.steps.length > 0);
    const yCap = Math.max(1000, 3 * (routers.flatMap((r) => r.steps.map((x) => x.ttftMs.p90)).filter((x) => Number.isFinite(x)).sort((a, b) => a - b)[0] ?? 1000));
    for (const [key, label] of [
      ['p90', 'p90'],
      ['p50', 'p50'],
      ['p99', 'p99'],
    ] as const) {
      L.push(
        writeSvg(
          dir,
          `quality-ttft-${key}.svg`,
          lineChart({
            title: `TTFT ${label} vs load (ms)`,
            xLabel: `offered load, % of fleet capacity (${fmt(c.fleetRps, 1)} req/s)`,
            yLabel: `TTFT ${label}, ms (log scale)`,
            logY: true,
            yMax: Math.max(yCap, 10_000),
            series: routers.map((r) => ({ name: r.router, points: r.steps.map((x) => [x.load * 100, x.ttftMs[key]] as [number, number]) })),
            vLines: [{ value: 80, label: 'target load' }],
            xTickFormat: (x) => `${Math.round(x)}%`,
          }),
          files,
        ),
      );
      L.push('');
    }
    L.push(
      writeSvg(
        dir,
        'quality-throughput.svg',
        lineChart({
          title: 'Completed requests/s vs offered load',
          xLabel: 'offered load, % of fleet capacity',
          yLabel: 'completed req/s (inside the step)',
          // Routers first, so each keeps the colour it has in the TTFT charts.
          series: [
            ...routers.map((r) => ({ name: r.router, points: r.steps.map((x) => [x.load * 100, x.completedRps] as [number, number]) })),
            { name: 'offered', points: (routers[0]?.steps ?? []).map((x) => [x.load * 100, x.rateRps] as [number, number]) },
          ],
          xTickFormat: (x) => `${Math.round(x)}%`,
        }),
        files,
      ),
    );
    L.push('');
    const at80 = routers.map((r) => ({ r, st: stepAt(r, TARGETS.qualityLoad) })).filter((x) => x.st !== undefined);
    if (at80.length) {
      const n = Math.max(...at80.map((x) => x.st!.share.length));
      L.push(
        writeSvg(
          dir,
          'quality-share-80.svg',
          barChart({
            title: 'Share of requests per instance at 80 % load (%)',
            yLabel: '% of requests',
            series: at80.map((x) => x.r.router),
            groups: Array.from({ length: n }, (_, i) => ({
              label: [...new Set(at80.map((x) => x.st!.instances[i]).filter((name): name is string => name !== undefined))].join(' / ') || `#${i}`,
              values: at80.map((x) => (x.st!.share[i] ?? NaN) * 100),
            })),
            labels: false,
          }),
          files,
        ),
      );
      L.push('');
    }
    if (q.distinct) {
      const d = q.distinct.step;
      L.push(
        `**Distinct prompts** (no shared prefix at all; Sluice default profile; ${Math.round(d.load * 100)} % of the all-uncached capacity = ${fmt(d.rateRps, 1)} req/s): ` +
          `share per instance ${d.share.map((x) => `${fmt(x * 100, 1)} %`).join(', ')} → the busiest has ×${fmt(d.maxShareOverMean)} the mean (target ≤ ×${TARGETS.shareOverMean}); ` +
          `TTFT p50/p90/p99 ${ms(d.ttftMs.p50)}/${ms(d.ttftMs.p90)}/${ms(d.ttftMs.p99)} ms, ${d.errors + d.unfinished} failed of ${d.sent}.`,
      );
      L.push('');
    }
    if (q.routers.some((r) => r.router === 'sluice-ttft')) {
      L.push(
        '`sluice-ttft` is the default plugins with `queue-scorer` weighed ×3 instead of ×2, as heavy as `prefix-cache-scorer` (the profile configuration.md recommends when TTFT matters most): ' +
          'a server that caches the prompt but has every slot taken then loses to one with a free slot, so a busy prompt spreads to more servers. The targets are measured on `sluice`, the default profile (SPEC §3.5).',
      );
      L.push('');
    }
    if (q.routers.some((r) => r.router === 'sluice-llmd')) {
      L.push(
        "`sluice-llmd` is llm-d's optimized baseline: `prefix-cache-affinity-filter` (peakPrefillThroughput 10 000 tokens/s, the simulator's; maxTTFTPenaltyMs 150, " +
          'what computing a shared system prompt costs) then `token-load-scorer`. Both read the uncached prompt tokens Sluice counts in flight per endpoint ' +
          '(configuration.md, "Prompt tokens in flight"). A comparison, not a target: the targets are measured on `sluice`, the default profile.',
      );
      L.push('');
    }
    if (q.routers.some((r) => r.router === 'sluice-fc-off')) {
      L.push(
        '`sluice-fc-off` is a diagnostic: the default profile with `featureGates: ["flowControl=false"]`, so requests are never held in the gateway queue; ' +
          'comparing it with `sluice` at high load shows what the saturation gate costs or saves.',
      );
      L.push('');
    }
    L.push(`**P/D variant:** ${q.pd.status}${q.pd.fleet ? ` (${q.pd.fleet} on the same ${q.options.instances} instances)` : ''} — ${q.pd.note}.`);
    if (q.pd.status === 'measured') {
      L.push(
        ' Configuration: `disagg-profile-handler` (connector nixlv2) with `prefix-based-pd-decider` (nonCachedTokens 256), prefill profile = prefill-filter + the default scorers, decode profile = decode-filter + the default scorers. ' +
          'The simulator models the prefill leg (one token, KV transfer parameters) and the decode leg (KV transfer latency instead of prefill), but not the interference between prefill and decode ' +
          'on one GPU that disaggregation exists to remove — so on this fleet P/D can only show its costs (an extra hop, fewer decode slots), not its benefit.',
      );
      const pdSteps = q.routers.find((r) => r.router === 'sluice-pd')?.steps ?? [];
      const decode = q.pd.decodeInstances;
      if (pdSteps.length > 0 && decode) {
        const perStep = pdSteps.map(
          (st) =>
            `at ${fmt(st.load * 100, 0)} %, ${fmtInt(st.prefillLegs ?? 0)} of ${fmtInt(st.sent)} requests (${fmt(((st.prefillLegs ?? 0) / Math.max(1, st.sent)) * 100, 1)} %) had a prefill leg, ` +
            `and every request ran on the ${decode} decode instances, ${fmt((st.load * q.options.instances * 100) / decode, 0)} % of their capacity`,
        );
        L.push(
          ` Where the load went: ${perStep.join('; ')}. A prompt the decode instance already caches (most of them, with a few shared system prompts) needs no prefill leg (\`prefix-based-pd-decider\`), so the prefill instances stand mostly idle.`,
        );
      }
    }
    L.push('');
  }

  // ---------------------------------------------------------------- scale
  const sc = res.scale;
  if (sc) {
    L.push('## 3. Scale');
    L.push('');
    if (sc.sched) {
      L.push(
        '**Scheduling cost vs endpoint count** — one decision through the real scheduler (decode-filter, utilization-detector filter, queue ×2, kv ×2, prefix ×3, max-score-picker, ' +
          'plus the PreRequest hook that teaches the prefix index), 1 KB distinct prompts sharing 32 prefixes, warm index; each decision timed on its own (`bench/lib/sched-sweep.ts`; ' +
          '`bench/scheduler.ts` has the 100 KB-prompt cases).',
      );
      L.push('');
      L.push(mdTable(['endpoints', 'decisions', 'median µs', 'p99 µs', 'mean µs', 'decisions/s (1 core, median)'], sc.sched.map((p) => [String(p.endpoints), fmtInt(p.decisions), fmt(p.medianUs, 1), fmt(p.p99Us, 1), fmt(p.meanUs, 1), fmtInt(1e6 / p.medianUs)]), 1));
      L.push('');
      L.push(
        writeSvg(
          dir,
          'scale-scheduling.svg',
          lineChart({
            title: 'Scheduling cost per decision vs endpoints',
            xLabel: 'endpoints (log scale)',
            yLabel: 'µs per decision (log scale)',
            logX: true,
            logY: true,
            series: [
              { name: 'median', points: sc.sched.map((p) => [p.endpoints, p.medianUs] as [number, number]) },
              { name: 'p99', points: sc.sched.map((p) => [p.endpoints, p.p99Us] as [number, number]) },
            ],
            refLines: [{ value: TARGETS.sched64Us, label: `target at 64 endpoints: ${TARGETS.sched64Us} µs` }],
            xTicks: sc.sched.map((p) => p.endpoints),
          }),
          files,
        ),
      );
      L.push('');
    }
    if (sc.flowcontrol) {
      L.push(
        '**Flow controller alone** (`bench/flowcontrol.ts`: 8 bands × 16 flows, FCFS + global-strict, TTL timers armed; memory from heap deltas after GC):',
      );
      L.push('');
      L.push(
        mdTable(
          ['queued', 'enqueue', 'enqueue/s', 'dispatch', 'dispatch/s', 'steady enq+disp', 'controller B/request', 'request record B'],
          sc.flowcontrol.depths.map((d) => [
            fmtInt(d.depth),
            `${fmt(d.enqueueNs, 0)} ns`,
            fmtInt(1e9 / d.enqueueNs),
            `${fmt(d.drainNs, 0)} ns`,
            fmtInt(1e9 / d.drainNs),
            `${fmt(d.steadyPairNs, 0)} ns`,
            d.memory ? fmt(d.memory.controllerBytes, 0) : '–',
            d.memory ? fmt(d.memory.requestBytes, 0) : '–',
          ]),
          1,
        ),
      );
      L.push('');      const many = sc.flowcontrol.manyFlows;
      if (many !== undefined && many.length > 0) {
        L.push(
          `**Many flows** (clients choose their fairness id): one band holding ${fmtInt(many[0]!.flows)} queued requests, each in a flow of its own, FCFS. The band answers the fairness policy from an index, O(log flows) per dispatch:`,
        );
        L.push('');
        L.push(
          mdTable(
            ['fairness policy', 'enqueue', 'dispatch', 'steady enq+disp'],
            many.map((m) => [`\`${m.fairness}\``, `${fmt(m.enqueueNs, 0)} ns`, `${fmt(m.drainNs, 0)} ns`, `${fmt(m.steadyPairNs, 0)} ns`]),
            1,
          ),
        );
        L.push('');
      }
    }
    const qu = sc.queue;
    if (qu) {
      L.push(
        `**The whole gateway holding queued requests:** Sluice (flow control on, band limit raised to 1M) in front of two backends that report 50 waiting requests, so every request is held in Sluice's queue. ` +
          `${fmtInt(qu.requests)} raw HTTP/1.1 connections each send one ${qu.bodyBytes}-byte chat request; memory is read after a full GC (a bench-only preload, \`bench/lib/mem-probe.ts\`). ` +
          'The container allows 20,000 open files per process, so 100k connections cannot be held: the 100k figure is extrapolated linearly.',
      );
      L.push('');
      L.push(
        mdTable(
          ['measure', 'value'],
          [
            ['queued (seen in /debug/flowcontrol)', fmtInt(qu.queuedSeen)],
            ['time to open and queue them', `${fmt(qu.fillSeconds, 1)} s`],
            ['RSS idle → with the queue (after GC)', `${fmt(qu.rssIdleMB, 1)} → ${fmt(qu.rssQueuedMB, 1)} MB`],
            ['RSS per queued request', `${fmtInt(qu.bytesPerQueuedRequest)} B`],
            ['V8 heap + external per queued request', `${fmtInt(qu.heapBytesPerQueuedRequest)} B`],
            ['bare node:http server holding the same parsed requests (Node\'s floor)', qu.baseline ? `${fmtInt(qu.baseline.bytesPerRequest)} B RSS, ${fmtInt(qu.baseline.heapBytesPerRequest)} B heap per request` : '–'],
            ['bare net.Server holding the connections unparsed (Node\'s floor for an open connection)', qu.tcpBaseline ? `${fmtInt(qu.tcpBaseline.bytesPerRequest)} B RSS, ${fmtInt(qu.tcpBaseline.heapBytesPerRequest)} B heap per connection → 100k ≈ ${fmt(mb(qu.tcpBaseline.bytesPerRequest * 100_000), 0)} MB` : '–'],
            ['Sluice\'s own heap per queued request (above the floor)', qu.baseline ? `${fmtInt(qu.heapBytesPerQueuedRequest - qu.baseline.heapBytesPerRequest)} B` : '–'],
            ['extrapolated RSS with 100k queued', `${fmt(qu.extrapolated100kMB, 0)} MB`],
            ['backends free → all answered', `${fmt(qu.drainSeconds, 2)} s (${fmtInt(qu.drainRps)} req/s through the proxy, ${fmtInt(qu.answered)} answered)`],
          ],
          1,
        ),
      );
      L.push('');
    }
    const so = sc.soak;
    if (so) {
      L.push(
        `**Soak:** Sluice (default config) behind wrk, 32 connections, ${fmtInt(so.requests)} JSON requests, each with a distinct ~250-character prompt (4 prefix blocks: the prefix index keeps learning and must evict), ` +
          `${fmt(so.seconds, 0)} s at ${fmtInt(so.rps)} req/s, ${so.errors} errors, ${fmt(so.cpuUsPerRequest, 0)} µs gateway CPU per request. ` +
          `RSS sampled every second: ${fmt(so.startMB, 1)} MB after the first 10 % of the requests, ${fmt(so.endMB, 1)} MB at the end (peak ${fmt(so.peakMB, 1)}, ${fmt(so.afterIdleMB, 1)} MB after 3 s idle). ` +
          (so.gcStart && so.gcEnd
            ? `After a full GC, once the RSS settled (V8 returns the freed pages from a background thread): RSS ${fmt(so.gcStart.rssMB, 1)} → ${fmt(so.gcEnd.rssMB, 1)} MB, V8 heap ${fmt(so.gcStart.heapUsedMB, 1)} → ${fmt(so.gcEnd.heapUsedMB, 1)} MB.`
            : ''),
      );
      L.push('');
      L.push(
        writeSvg(
          dir,
          'scale-soak-rss.svg',
          lineChart({
            title: `Gateway RSS while serving ${fmtInt(so.requests)} requests`,
            xLabel: `seconds (${fmtInt(so.rps)} req/s)`,
            yLabel: 'RSS, MB',
            series: [{ name: 'RSS (sampled every second)', points: so.samples.map((x) => [x.t, x.rssMB] as [number, number]) }],
            xTicks: niceTicks(so.seconds),
          }),
          files,
        ),
      );
      L.push('');
    }
    for (const [part, err] of Object.entries(sc.errors)) L.push(`> ${part} failed: ${err.split('\n')[0]}\n`);
  }

  L.push('## How to run');
  L.push('');
  L.push('```sh');
  L.push('npm run bench                       # quick (~5 min): overhead, quality, scale');
  L.push('npm run bench -- --full             # full (~20 min): longer runs, 8 instances, more load steps, 1M-request soak');
  L.push('npm run bench -- --only overhead,scale');
  L.push('```');
  L.push('');
  L.push('Needs `wrk` (else autocannon is used) and `nginx-light` (else nginx rows are skipped). Everything runs on 127.0.0.1; every process started is stopped at the end, on error and on Ctrl-C.');
  L.push('');
  writeFileSync(join(dir, 'REPORT.md'), L.join('\n'));
  files.push('REPORT.md');
  return files;
}

function niceTicks(max: number): number[] {
  const step = max <= 10 ? 2 : max <= 50 ? 10 : max <= 200 ? 25 : max <= 500 ? 50 : max <= 1000 ? 100 : 200;
  const out: number[] = [];
  for (let v = 0; v <= max + 1e-9; v += step) out.push(v);
  return out;
}

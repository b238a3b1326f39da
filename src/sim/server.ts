/**
 * HTTP surface of the simulator (SPEC §8): the vLLM/OpenAI routes in front of a SimEngine, plus
 * /metrics in vLLM's names, failure injection and a small admin API. Plain node:http on purpose:
 * benchmarks push thousands of requests per second through it.
 *
 * P/D (`kv_transfer_params`, vLLM NixlConnector): `do_remote_decode: true` makes a prefill request
 * — one token, `finish_reason: "remote_decode"`, and the answer's `kv_transfer_params` tell a
 * decoder where to pull the KV from (this sim's name, host, port and block ids); streaming it is a
 * 400. `do_remote_prefill: true` makes a decode request that pays a KV-transfer latency instead of
 * the prefill cost.
 *
 * Several choices (as vLLM V1): `n > 1` fans a request out into n engine requests (children) that
 * share the prompt; a `/v1/completions` prompt batch (an array of strings or of token-id arrays)
 * is one engine request (n with `n`) per prompt. Choice index = promptIndex × n + i; usage counts
 * each prompt once and every choice's tokens. The request is accepted whole or refused (429).
 *
 * The Responses API (`POST /v1/responses`, vLLM's non-harmony path and its response store) is
 * responses.ts's; what the routes share (errors, field readers, the SSE base) is protocol.ts's.
 */
import { createServer, validateHeaderValue, type IncomingMessage, type OutgoingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { RandomSource } from '../util/clock.js';
import {
  SimEngine,
  TTFT_BUCKETS_SECONDS,
  type GenerationInput,
  type GenerationListener,
  type FinishReason,
  type GenerationResult,
  type SimEngineOptions,
  type SimRequestHandle,
  type SimLatencySettings,
  type SimPins,
} from './engine.js';
import {
  EventStream,
  QUEUE_FULL_MESSAGE,
  SimHttpError,
  boundOutput,
  cacheSaltOf,
  checkModel,
  errorBody,
  isObject,
  optionalFlag,
  optionalPositiveInt,
  type JsonObject,
} from './protocol.js';

import { ResponseStore, ResponsesEventStream, ResponsesJsonAnswer, toResponsesTurn } from './responses.js';

export { SimHttpError, errorBody, errorTypeFor } from './protocol.js';

/** What SimOptions' own settings default to (also shown by `sluice sim --help`). */
export const SERVER_DEFAULTS = {
  host: '127.0.0.1',
  model: 'sim-model',
  failureRate: 0,
  failureStatus: 500,
  maxModelLen: 131_072,
} as const;

export interface SimOptions extends SimEngineOptions {
  /** 0 (default) picks an ephemeral port. */
  port?: number;
  /** Default 127.0.0.1. */
  host?: string;
  /** Pod name reported in `x-inference-pod`; default `sim-<port>`. */
  name?: string;
  /** The one served model; default "sim-model". */
  model?: string;
  /** Probability in [0, 1] that an inference request fails with failureStatus. Default 0. */
  failureRate?: number;
  /** Status of random failures. Default 500. */
  failureStatus?: number;
  /** Request bodies larger than this get 413. Default 32 MiB (above the gateway's 16Mi default). */
  maxBodyBytes?: number;
  /**
   * Context window in tokens (vLLM --max-model-len), checked on each prompt's tokens (the estimate
   * from its text, or the number of its token ids): a prompt
   * of this many tokens or more, or prompt + max_tokens above it, gets a 400 at once, as from vLLM.
   * Default 131072; 0 = no limit. Without it a huge prompt is held for its whole simulated prefill
   * (3M tokens × 0.1 ms: past the gateway's upstream time-out).
   */
  maxModelLen?: number;
  /**
   * vLLM's Responses API store (its env VLLM_ENABLE_RESPONSES_API_STORE, off by default): keeps each
   * response made with `store` not false, so a later request may continue it by `previous_response_id`.
   * Off, `store: true` is read as false. vLLM keeps every response; this store the newest 10 000.
   */
  responsesStore?: boolean;
  random?: RandomSource;
}

export interface RunningSimulator {
  port: number;
  url: string;
  name: string;
  engine: SimEngine;
  close(): Promise<void>;
}

/** Effective run-time settings, as returned by /admin/config. */
export interface SimAdminSettings extends SimLatencySettings {
  failureRate: number;
  failureStatus: number;
  maxModelLen: number;
  pin: SimPins;
}

const ADMIN_NUMBER_KEYS = ['ttftOverheadMs', 'prefillMsPerToken', 'itlMs', 'kvTransferMs', 'kvTransferMsPerToken'] as const;
const ADMIN_KEYS = new Set<string>([...ADMIN_NUMBER_KEYS, 'maxNumSeqs', 'maxWaiting', 'maxModelLen', 'failureRate', 'pin']);
const PIN_KEYS = new Set<string>(['waiting', 'running', 'kvUsage']);

/**
 * OpenAI routes the gateway forwards but the simulator does not serve. They get a 404 that says so,
 * not the generic one, which reads like a gateway problem.
 */
const UNIMPLEMENTED_OPENAI_ROUTES = new Set<string>(['/v1/embeddings']);

type InferenceApi = 'chat' | 'completions' | 'responses';
const INFERENCE_ROUTES = new Map<string, InferenceApi>([
  ['/v1/chat/completions', 'chat'],
  ['/v1/completions', 'completions'],
  ['/v1/responses', 'responses'],
]);

export async function startSimulator(opts: SimOptions = {}): Promise<RunningSimulator> {
  const engine = new SimEngine(opts);
  const clock = opts.clock ?? { now: () => Date.now() };
  const model = opts.model ?? SERVER_DEFAULTS.model;
  const modelJson = JSON.stringify(model);
  const random = opts.random ?? Math.random;
  const maxBodyBytes = opts.maxBodyBytes ?? 32 * 1024 * 1024;
  let failureRate = opts.failureRate ?? SERVER_DEFAULTS.failureRate;
  const failureStatus = opts.failureStatus ?? SERVER_DEFAULTS.failureStatus;
  let maxModelLen = opts.maxModelLen ?? SERVER_DEFAULTS.maxModelLen;
  if (!(failureRate >= 0 && failureRate <= 1)) throw new Error('failureRate must be within [0, 1]');
  if (!(Number.isInteger(maxModelLen) && maxModelLen >= 0)) throw new Error('maxModelLen must be an integer ≥ 0 (0 = no limit)');
  if (!(Number.isInteger(failureStatus) && failureStatus >= 400 && failureStatus <= 599)) {
    throw new Error('failureStatus must be an HTTP error status (400-599)');
  }
  const startedAtSec = Math.floor(Date.now() / 1000);
  let name = opts.name ?? '';
  if (name !== '') {
    try {
      validateHeaderValue('x-inference-pod', name);
    } catch {
      throw new Error(`name ${JSON.stringify(name)} cannot be sent as the x-inference-pod header`);
    }
  }
  let idSeq = 0;
  // vLLM's Responses API store (VLLM_ENABLE_RESPONSES_API_STORE): off unless asked for.
  const responseStore = opts.responsesStore === true ? new ResponseStore() : undefined;
  // Where a decoder would pull KV blocks from (set once listening), and the next block id handed out.
  let kvHost = '';
  let kvPort = 0;
  let nextBlockId = 0;
  const metricsText = metricsRenderer(engine, model, startedAtSec);

  const server = createServer({ noDelay: true, keepAlive: true }, (req, res) => {
    try {
      route(req, res);
    } catch (err) {
      try {
        sendError(res, req, err);
      } catch {
        res.destroy(); // the answer itself cannot be written: never a crash
      }
    }
  });
  // Gateways pool connections; outlive their idle timeouts (typically 60 s) so we never close first.
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;

  function baseHeaders(req: IncomingMessage): OutgoingHttpHeaders {
    const headers: OutgoingHttpHeaders = { 'x-inference-pod': name };
    const rid = req.headers['x-request-id'];
    if (rid !== undefined) headers['x-request-id'] = rid;
    return headers;
  }

  function sendJson(res: ServerResponse, req: IncomingMessage, status: number, body: string): void {
    if (res.headersSent) {
      res.end();
      return;
    }
    const headers = baseHeaders(req);
    headers['content-type'] = 'application/json';
    headers['content-length'] = Buffer.byteLength(body);
    res.writeHead(status, headers);
    res.end(body);
  }

  function sendError(res: ServerResponse, req: IncomingMessage, err: unknown): void {
    if (err instanceof SimHttpError) sendJson(res, req, err.status, errorBody(err.status, err.message, err.param, err.type));
    else sendJson(res, req, 500, errorBody(500, err instanceof Error ? err.message : String(err)));
  }

  function route(req: IncomingMessage, res: ServerResponse): void {
    const rawUrl = req.url ?? '/';
    const q = rawUrl.indexOf('?');
    const path = q < 0 ? rawUrl : rawUrl.slice(0, q);
    const method = req.method;
    const api = method === 'POST' ? INFERENCE_ROUTES.get(path) : undefined;
    if (api !== undefined) {
      handleInference(req, res, api);
    } else if (method === 'GET' && path === '/metrics') {
      const text = metricsText();
      const headers = baseHeaders(req);
      headers['content-type'] = 'text/plain; version=0.0.4; charset=utf-8';
      headers['content-length'] = Buffer.byteLength(text);
      res.writeHead(200, headers);
      res.end(text);
    } else if (method === 'GET' && path === '/health') {
      const headers = baseHeaders(req);
      headers['content-length'] = 0;
      res.writeHead(200, headers);
      res.end();
    } else if (method === 'GET' && path === '/v1/models') {
      sendJson(res, req, 200, JSON.stringify({
        object: 'list',
        data: [{ id: model, object: 'model', created: startedAtSec, owned_by: 'vllm', root: model, parent: null }],
      }));
    } else if (path === '/admin/config' && (method === 'POST' || method === 'GET')) {
      if (method === 'GET') sendJson(res, req, 200, JSON.stringify(adminSettings()));
      else readBody(req, res, (body) => handleAdmin(req, res, body));
    } else if (method === 'POST' && UNIMPLEMENTED_OPENAI_ROUTES.has(path)) {
      sendJson(res, req, 404, errorBody(404, `sluice sim does not implement POST ${path} (chat completions, completions and responses only)`));
    } else {
      sendJson(res, req, 404, errorBody(404, `Not found: ${method} ${path}`));
    }
  }

  /** Buffers the body (up to maxBodyBytes) and calls back once; drops it if the client goes away. */
  function readBody(req: IncomingMessage, res: ServerResponse, onBody: (body: Buffer) => void): void {
    const declared = Number(req.headers['content-length']);
    if (declared > maxBodyBytes) {
      sendJson(res, req, 413, errorBody(413, `Request body exceeds ${maxBodyBytes} bytes`));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let tooLarge = false;
    req.on('data', (chunk: Buffer) => {
      if (tooLarge) return;
      size += chunk.length;
      if (size > maxBodyBytes) {
        tooLarge = true;
        sendJson(res, req, 413, errorBody(413, `Request body exceeds ${maxBodyBytes} bytes`));
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => {
      if (tooLarge || res.destroyed) return;
      try {
        onBody(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
      } catch (err) {
        sendError(res, req, err);
      }
    });
    req.on('error', () => {
      /* client went away mid-body; nothing to answer */
    });
  }

  function parseJsonObject(body: Buffer): JsonObject {
    let parsed: unknown;
    try {
      parsed = JSON.parse(body.toString('utf8'));
    } catch (err) {
      throw new SimHttpError(400, `Invalid JSON body: ${(err as Error).message}`);
    }
    if (!isObject(parsed)) throw new SimHttpError(400, 'Request body must be a JSON object');
    return parsed;
  }

  function handleInference(req: IncomingMessage, res: ServerResponse, api: InferenceApi): void {
    const injected = req.headers['x-return-error'];
    if (injected !== undefined) {
      const status = Number(Array.isArray(injected) ? injected[0] : injected);
      if (Number.isInteger(status) && status >= 400 && status <= 599) {
        sendJson(res, req, status, errorBody(status, `Injected error (x-return-error: ${status})`));
        return;
      }
    }
    if (failureRate > 0 && random() < failureRate) {
      sendJson(res, req, failureStatus, errorBody(failureStatus, 'Injected failure (failure rate)'));
      return;
    }
    readBody(req, res, (body) => {
      const json = parseJsonObject(body);
      if (api === 'responses') runResponse(req, res, json);
      else runInference(req, res, api === 'chat', json);
    });
  }

  /** 429 as vLLM's full waiting queue. */
  function refuseQueueFull(req: IncomingMessage, res: ServerResponse): void {
    sendJson(res, req, 429, errorBody(429, QUEUE_FULL_MESSAGE));
  }

  /** A client that goes away frees its slots (or queue places) at once, as vLLM aborts on disconnect. */
  function abortOnClose(res: ServerResponse, handles: readonly SimRequestHandle[]): void {
    res.on('close', () => {
      if (!res.writableFinished) for (const h of handles) h.abort();
    });
  }

  function runResponse(req: IncomingMessage, res: ServerResponse, body: JsonObject): void {
    const turn = toResponsesTurn(body, model, maxModelLen, responseStore, Math.floor(clock.now() / 1000));
    const sse = turn.stream ? new ResponsesEventStream(res, baseHeaders(req), turn) : undefined;
    const submitted = engine.submit(turn.input, sse ?? new ResponsesJsonAnswer(turn, (json) => sendJson(res, req, 200, json)));
    if (!submitted.accepted) {
      refuseQueueFull(req, res);
      return;
    }
    sse?.begin();
    abortOnClose(res, [submitted.request]);
  }

  function runInference(req: IncomingMessage, res: ServerResponse, chat: boolean, body: JsonObject): void {
    const { prompts, n, stream } = toGenerationRequest(body, chat, model, maxModelLen);
    const streamOptions = body.stream_options;
    const includeUsage = stream && isObject(streamOptions) && streamOptions.include_usage === true;
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${name}-${++idSeq}`;
    const created = Math.floor(clock.now() / 1000);
    const choices = prompts.length * n;
    // Every child or none: a fanned-out request is not half queued.
    if (!engine.hasRoomFor(choices)) {
      refuseQueueFull(req, res);
      return;
    }

    const sse = stream ? new SseWriter(res, baseHeaders(req), chat, id, created, modelJson, includeUsage, choices, n) : undefined;
    const json = sse
      ? undefined
      : new JsonAnswer(choices, (results) => {
          const kv = prompts[0]!.remoteDecode ? prefillKvParams(results[0]!) : undefined;
          sendJson(res, req, 200, completionJson(chat, id, created, model, results, n, kv));
        });
    const handles: SimRequestHandle[] = new Array<SimRequestHandle>(choices);
    for (let p = 0; p < prompts.length; p++) {
      const input = prompts[p]!;
      let first: SimRequestHandle | undefined;
      for (let i = 0; i < n; i++) {
        const choice = p * n + i;
        const submitted = engine.submit(input, sse ? new StreamedChoice(sse, choice) : new AnsweredChoice(json!, choice), i === 0 ? undefined : { sibling: first!, choice: i });
        if (!submitted.accepted) {
          // hasRoomFor said yes; never expected, but leave nothing behind if it happens.
          for (let c = 0; c < choice; c++) handles[c]!.abort();
          refuseQueueFull(req, res);
          return;
        }
        handles[choice] = submitted.request;
        first ??= submitted.request;
      }
    }
    // As vLLM (a Starlette StreamingResponse): a stream's headers go out once it is accepted, before its queue wait and prefill.
    sse?.begin();
    abortOnClose(res, handles);
  }

  /** What vLLM's NixlConnector returns from a prefill: where the decoder pulls the prompt's KV from. */
  function prefillKvParams(result: GenerationResult): JsonObject {
    const blocks = Math.ceil(result.promptTokens / engine.blockSizeTokens);
    const ids: number[] = new Array<number>(blocks);
    for (let i = 0; i < blocks; i++) {
      ids[i] = nextBlockId;
      nextBlockId = (nextBlockId + 1) % engine.numGpuBlocks;
    }
    return {
      do_remote_decode: false,
      do_remote_prefill: true,
      remote_block_ids: ids,
      remote_engine_id: `${name}-engine`,
      remote_host: kvHost,
      remote_port: kvPort,
      tp_size: 1,
    };
  }

  function adminSettings(): SimAdminSettings {
    return { ...engine.settings, failureRate, failureStatus, maxModelLen, pin: { ...engine.pinned } };
  }

  function handleAdmin(req: IncomingMessage, res: ServerResponse, rawBody: Buffer): void {
    const body = parseJsonObject(rawBody);
    const patch: Partial<SimLatencySettings> = {};
    const pinPatch: Partial<SimPins> = {};
    let newFailureRate: number | undefined;
    let newMaxModelLen: number | undefined;
    for (const [key, value] of Object.entries(body)) {
      if (!ADMIN_KEYS.has(key)) throw new SimHttpError(400, `Unknown setting: ${key}`, key);
      if (key === 'pin') {
        if (!isObject(value)) throw new SimHttpError(400, 'pin must be an object', 'pin');
        for (const [pk, pv] of Object.entries(value)) {
          if (!PIN_KEYS.has(pk)) throw new SimHttpError(400, `Unknown pin: ${pk}`, `pin.${pk}`);
          if (pv === null) pinPatch[pk as keyof SimPins] = null;
          else if (typeof pv === 'number' && Number.isFinite(pv) && pv >= 0 && (pk !== 'kvUsage' || pv <= 1)) {
            pinPatch[pk as keyof SimPins] = pv;
          } else {
            throw new SimHttpError(400, `pin.${pk} must be null or a number ≥ 0${pk === 'kvUsage' ? ' and ≤ 1' : ''}`, `pin.${pk}`);
          }
        }
      } else if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
        throw new SimHttpError(400, `${key} must be a number ≥ 0`, key);
      } else if (key === 'failureRate') {
        if (value > 1) throw new SimHttpError(400, 'failureRate must be within [0, 1]', key);
        newFailureRate = value;
      } else if (key === 'maxModelLen') {
        if (!Number.isInteger(value)) throw new SimHttpError(400, 'maxModelLen must be an integer ≥ 0 (0 = no limit)', key);
        newMaxModelLen = value;
      } else if (key === 'maxNumSeqs' || key === 'maxWaiting') {
        if (!Number.isInteger(value) || (key === 'maxNumSeqs' && value < 1)) {
          throw new SimHttpError(400, `${key} must be an integer ≥ ${key === 'maxNumSeqs' ? 1 : 0}`, key);
        }
        patch[key] = value;
      } else {
        patch[key as (typeof ADMIN_NUMBER_KEYS)[number]] = value;
      }
    }
    // Validated in full above, so the change applies all-or-nothing.
    engine.configure(patch);
    engine.pin(pinPatch);
    if (newFailureRate !== undefined) failureRate = newFailureRate;
    if (newMaxModelLen !== undefined) maxModelLen = newMaxModelLen;
    sendJson(res, req, 200, JSON.stringify(adminSettings()));
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, opts.host ?? SERVER_DEFAULTS.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  if (!name) name = `sim-${address.port}`;
  kvHost = address.address;
  kvPort = address.port;
  const hostForUrl = address.family === 'IPv6' ? `[${address.address}]` : address.address;

  let closing: Promise<void> | undefined;
  return {
    port: address.port,
    url: `http://${hostForUrl}:${address.port}`,
    name,
    engine,
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
        engine.dispose();
      });
      return closing;
    },
  };
}

/** A validated inference request: one engine input per prompt, each run as n children. */
export interface GenerationRequest {
  /** One per prompt (a `/v1/completions` batch has several; chat has one). */
  prompts: GenerationInput[];
  /** vLLM's `n`: choices per prompt. */
  n: number;
  stream: boolean;
}

/**
 * Validates an OpenAI body (as vLLM does, including its context-window check against `maxModelLen`,
 * 0 = none, for each prompt) and maps it to the engine's inputs; throws SimHttpError 400/404.
 */
export function toGenerationRequest(body: JsonObject, chat: boolean, servedModel: string, maxModelLen: number): GenerationRequest {
  checkModel(body, servedModel);
  // Each prompt as text (chars / 4 tokens) or as token ids (one token each).
  const prompts: GenerationInput[] = [];
  if (chat) {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0 || !messages.every((m) => isObject(m) && typeof m.role === 'string')) {
      throw new SimHttpError(400, 'Field required: messages (a non-empty array of message objects, each with a role)', 'messages');
    }
    // Same text the gateway's approximate prefix index hashes, so predicted and real hits agree.
    try {
      prompts.push({ promptText: JSON.stringify(messages) });
    } catch {
      throw new SimHttpError(400, 'messages are nested too deeply', 'messages'); // RangeError: call stack
    }
  } else {
    // vLLM's forms: a string; one token-id array (ONE prompt); a batch: strings or token-id arrays.
    const prompt = body.prompt;
    if (typeof prompt === 'string' && prompt !== '') prompts.push({ promptText: prompt });
    else if (Array.isArray(prompt) && prompt.length > 0 && prompt.every((t) => Number.isInteger(t))) {
      prompts.push({ promptText: '', promptTokenIds: prompt as number[] });
    } else if (Array.isArray(prompt) && prompt.length > 0 && prompt.every((p) => typeof p === 'string' && p !== '')) {
      for (const p of prompt as string[]) prompts.push({ promptText: p });
    } else if (Array.isArray(prompt) && prompt.length > 0 && prompt.every((p) => Array.isArray(p) && p.length > 0 && p.every((t) => Number.isInteger(t)))) {
      for (const p of prompt as number[][]) prompts.push({ promptText: '', promptTokenIds: p });
    } else {
      throw new SimHttpError(400, 'Field required: prompt (a non-empty string, string array, token array or array of token arrays)', 'prompt');
    }
  }
  const n = optionalPositiveInt(body, 'n') ?? 1;
  const maxTokens = optionalPositiveInt(body, chat ? 'max_completion_tokens' : undefined) ??
    optionalPositiveInt(body, 'max_tokens');
  for (const input of prompts) boundOutput(input, maxTokens, maxModelLen, chat ? 'messages' : 'prompt');
  const stream = optionalFlag(body, 'stream', false);
  // vLLM's validate_stream_options: what a P/D prefill leg must strip (it is sent with stream: false).
  if (body.stream_options !== undefined && body.stream_options !== null && !stream) {
    throw new SimHttpError(400, 'Stream options can only be defined when `stream=True`.', 'stream_options');
  }
  const salt = cacheSaltOf(body);
  if (salt !== undefined) for (const input of prompts) input.cacheSalt = salt;
  const kv = body.kv_transfer_params;
  if (kv !== undefined && kv !== null) {
    if (!isObject(kv)) throw new SimHttpError(400, 'kv_transfer_params must be an object', 'kv_transfer_params');
    if (kv.do_remote_decode === true) {
      if (stream) throw new SimHttpError(400, 'Prefill does not support streaming', 'stream');
      // A prefill answer carries one kv_transfer_params, for one prompt's blocks: how vLLM would
      // serve n children or a batch here is unclear, so this sim refuses them (a gateway passes the 400 on).
      if (n > 1) throw new SimHttpError(400, 'Prefill (kv_transfer_params.do_remote_decode) does not support n > 1', 'n');
      if (prompts.length > 1) throw new SimHttpError(400, 'Prefill (kv_transfer_params.do_remote_decode) does not support a batch of prompts', 'prompt');
      prompts[0]!.remoteDecode = true;
    } else if (kv.do_remote_prefill === true) {
      // A decode leg: every child pays the transfer of what it does not find cached (its siblings' blocks are).
      for (const input of prompts) input.remotePrefill = true;
    }
  }
  return { prompts, n, stream };
}

/** Token counts of a whole answer: each prompt once (its first choice's counts), every choice's output. */
interface UsageCounts {
  prompt: number;
  completion: number;
  cached: number;
}

function usageOf(u: UsageCounts): JsonObject {
  return {
    prompt_tokens: u.prompt,
    completion_tokens: u.completion,
    total_tokens: u.prompt + u.completion,
    prompt_tokens_details: { cached_tokens: u.cached },
  };
}

function usageOfResults(results: readonly GenerationResult[], n: number): UsageCounts {
  const u: UsageCounts = { prompt: 0, completion: 0, cached: 0 };
  for (let c = 0; c < results.length; c++) {
    const r = results[c]!;
    u.completion += r.completionTokens;
    if (c % n === 0) {
      u.prompt += r.promptTokens;
      u.cached += r.cachedTokens;
    }
  }
  return u;
}

function completionJson(
  chat: boolean,
  id: string,
  created: number,
  model: string,
  results: readonly GenerationResult[],
  n: number,
  kvTransferParams?: JsonObject,
): string {
  const choices = results.map((result, index) => chat
    ? { index, message: { role: 'assistant', content: result.text }, logprobs: null, finish_reason: result.finishReason }
    : { index, text: result.text, logprobs: null, finish_reason: result.finishReason });
  const answer: JsonObject = {
    id,
    object: chat ? 'chat.completion' : 'text_completion',
    created,
    model,
    choices,
    usage: usageOf(usageOfResults(results, n)),
  };
  if (kvTransferParams !== undefined) answer.kv_transfer_params = kvTransferParams;
  return JSON.stringify(answer);
}

/** The engine listener of one streamed choice (one child request). */
class StreamedChoice implements GenerationListener {
  constructor(private readonly sse: SseWriter, private readonly choice: number) {}

  onToken(text: string, index: number, finishReason: FinishReason | null): void {
    this.sse.token(this.choice, text, index, finishReason);
  }

  onFinish(result: GenerationResult): void {
    this.sse.finished(this.choice, result);
  }
}

/** The engine listener of one non-streamed choice: no onToken, so the engine skips per-token timers. */
class AnsweredChoice implements GenerationListener {
  constructor(private readonly answer: JsonAnswer, private readonly choice: number) {}

  onFinish(result: GenerationResult): void {
    this.answer.finished(this.choice, result);
  }
}

/** Collects every choice's result; answers once the last one finished. */
class JsonAnswer {
  private readonly results: GenerationResult[];
  private open: number;

  constructor(choices: number, private readonly answer: (results: readonly GenerationResult[]) => void) {
    this.results = new Array<GenerationResult>(choices);
    this.open = choices;
  }

  finished(choice: number, result: GenerationResult): void {
    this.results[choice] = result;
    if (--this.open === 0) this.answer(this.results);
  }
}

/**
 * Streams one request's choices as SSE, as vLLM: the headers once it is accepted; for chat, when the
 * first token of any choice is ready, one role-only chunk per choice (`"delta":{"role":"assistant",
 * "content":""}`, vLLM's first iteration); then one `data:` event per token with its choice's index,
 * interleaved as generated, each choice's last token carrying its finish_reason; once every choice
 * finished the optional usage chunk and `[DONE]`. Event strings are assembled from precomputed
 * pieces (hot path).
 */
class SseWriter extends EventStream {
  /** Per choice: the event up to and including `"index":N,`. */
  private readonly heads: string[];
  private readonly tail: string;
  private rolesSent = false;
  private open: number;
  private readonly usage: UsageCounts = { prompt: 0, completion: 0, cached: 0 };
  private readonly n: number;

  constructor(
    res: ServerResponse,
    headers: OutgoingHttpHeaders,
    private readonly chat: boolean,
    private readonly id: string,
    private readonly created: number,
    private readonly modelJson: string,
    private readonly includeUsage: boolean,
    choices: number,
    n: number,
  ) {
    super(res, headers);
    const object = chat ? 'chat.completion.chunk' : 'text_completion';
    const prefix = `data: {"id":${JSON.stringify(id)},"object":"${object}","created":${created},"model":${modelJson},"choices":[{"index":`;
    this.heads = new Array<string>(choices);
    for (let c = 0; c < choices; c++) this.heads[c] = `${prefix}${c},`;
    this.tail = chat ? '},"logprobs":null,"finish_reason":' : ',"logprobs":null,"finish_reason":';
    this.open = choices;
    this.n = n;
  }

  token(choice: number, text: string, index: number, finishReason: FinishReason | null): void {
    const res = this.res;
    if (index === 0) this.begin();
    this.corkUntilNextTick();
    if (this.chat && !this.rolesSent) {
      this.rolesSent = true;
      const heads = this.heads;
      let roles = '';
      for (let c = 0; c < heads.length; c++) roles += heads[c] + '"delta":{"role":"assistant","content":""' + this.tail + 'null}]}\n\n';
      res.write(roles);
    }
    const content = JSON.stringify(text);
    const body = this.chat ? `"delta":{"content":${content}` : `"text":${content}`;
    res.write(this.heads[choice] + body + this.tail + (finishReason === null ? 'null' : `"${finishReason}"`) + '}]}\n\n');
  }

  finished(choice: number, result: GenerationResult): void {
    const u = this.usage;
    u.completion += result.completionTokens;
    if (choice % this.n === 0) {
      u.prompt += result.promptTokens;
      u.cached += result.cachedTokens;
    }
    if (--this.open > 0) return;
    const res = this.res;
    if (this.includeUsage) {
      const object = this.chat ? 'chat.completion.chunk' : 'text_completion';
      res.write(
        `data: {"id":${JSON.stringify(this.id)},"object":"${object}","created":${this.created},"model":${this.modelJson},` +
          `"choices":[],"usage":${JSON.stringify(usageOf(u))}}\n\n`,
      );
    }
    res.end('data: [DONE]\n\n');
  }
}

/** Renders /metrics; static text (HELP/TYPE lines, label sets) is built once. */
export type MetricsRenderer = () => string;

function escapeLabel(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

export function metricsRenderer(engine: SimEngine, model: string, startedAtSec: number): MetricsRenderer {
  const m = `model_name="${escapeLabel(model)}"`;
  const lbl = `{${m}}`;
  const gauge = (name: string, help: string): string => `# HELP ${name} ${help}\n# TYPE ${name} gauge\n`;
  const counter = (name: string, help: string): string => `# HELP ${name} ${help}\n# TYPE ${name} counter\n`;

  const cacheConfig =
    gauge('vllm:cache_config_info', 'Information of the LLMEngine CacheConfig.') +
    `vllm:cache_config_info{block_size="${engine.blockSizeTokens}",num_gpu_blocks="${engine.numGpuBlocks}"} 1\n`;
  const lora =
    gauge('vllm:lora_requests_info', 'Running stats on lora requests.') +
    `vllm:lora_requests_info{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""} ${startedAtSec}\n`;
  const kvHead = gauge('vllm:kv_cache_usage_perc', 'Prometheus metric for the fraction of KV-cache blocks currently in use (from 0 to 1).') + `vllm:kv_cache_usage_perc${lbl} `;
  const runHead = gauge('vllm:num_requests_running', 'Number of requests currently running on GPU.') + `vllm:num_requests_running${lbl} `;
  const waitHead = gauge('vllm:num_requests_waiting', 'Prometheus metric for the number of queued requests.') + `vllm:num_requests_waiting${lbl} `;
  const hitsHead = counter('vllm:prefix_cache_hits_total', 'Prefix cache hits, in terms of number of cached tokens.') + `vllm:prefix_cache_hits_total${lbl} `;
  const queriesHead = counter('vllm:prefix_cache_queries_total', 'Prefix cache queries, in terms of number of queried tokens.') + `vllm:prefix_cache_queries_total${lbl} `;
  const promptHead = counter('vllm:prompt_tokens_total', 'Total number of prompt tokens processed.') + `vllm:prompt_tokens_total${lbl} `;
  const genHead = counter('vllm:generation_tokens_total', 'Total number of generated tokens.') + `vllm:generation_tokens_total${lbl} `;
  const successHead = counter('vllm:request_success_total', 'Count of successfully processed requests.');
  const successPrefix = (reason: string): string => `vllm:request_success_total{finish_reason="${reason}",${m}} `;
  const successLines = {
    abort: successPrefix('abort'),
    length: successPrefix('length'),
    remote_decode: successPrefix('remote_decode'),
    stop: successPrefix('stop'),
  };
  const ttftHead = '# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n' +
    '# TYPE vllm:time_to_first_token_seconds histogram\n';
  const bucketPrefixes = [...TTFT_BUCKETS_SECONDS.map((b) => String(b)), '+Inf'].map(
    (le) => `vllm:time_to_first_token_seconds_bucket{${m},le="${le}"} `,
  );
  const ttftSum = `vllm:time_to_first_token_seconds_sum${lbl} `;
  const ttftCount = `vllm:time_to_first_token_seconds_count${lbl} `;

  return () => {
    const g = engine.reportedGauges();
    const c = engine.counters;
    const s = c.requestSuccess;
    const h = engine.ttftHistogram();
    let out = cacheConfig + lora +
      kvHead + g.kvUsage + '\n' +
      runHead + g.running + '\n' +
      waitHead + g.waiting + '\n' +
      hitsHead + c.prefixCacheHits + '\n' +
      queriesHead + c.prefixCacheQueries + '\n' +
      promptHead + c.promptTokens + '\n' +
      genHead + engine.generationTokensNow() + '\n' +
      successHead +
      successLines.abort + s.abort + '\n' +
      successLines.length + s.length + '\n' +
      successLines.remote_decode + s.remote_decode + '\n' +
      successLines.stop + s.stop + '\n' +
      ttftHead;
    let cumulative = 0;
    for (let i = 0; i < bucketPrefixes.length; i++) {
      cumulative += h.counts[i]!;
      out += bucketPrefixes[i]! + cumulative + '\n';
    }
    out += ttftSum + h.sum + '\n' + ttftCount + h.count + '\n';
    return out;
  };
}

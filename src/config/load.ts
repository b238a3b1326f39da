/**
 * Config loader: text (YAML or JSON) → validated, defaulted, "ensured" effective config.
 *
 * Every problem is collected (not just the first) and reported as `FILE:LINE:COL: path: message`,
 * the position being that of the offending node (the key itself for an unknown key, the parent
 * mapping for a missing one). Pipeline (reference §1.7): YAML parse → strict schema per section
 * (defaults, units) → plugin types and parameters (registry schemas) → ensure (defaults.ts) →
 * cross-reference checks on the ensured config.
 */
import { readFileSync } from 'node:fs';
import { isAlias, isMap, isScalar, isSeq, LineCounter, parseAllDocuments, parseDocument, visit, type Document, type ErrorCode, type YAMLError } from 'yaml';
import type { z } from 'zod';
import type { PluginKind, PluginRegistry } from '../plugins/registry.js';
import { ensure, featureEnabled } from './defaults.js';
import {
  API_VERSION,
  configIssueMessage,
  DEPRECATED_API_VERSION,
  describeValue,
  didYouMean,
  unknownPluginTypeMessage,
  NO_EFFECT_FEATURE_GATES,
  parseFeatureGate,
  pluginSpecSchema,
  rawConfigSchema,
  profilePluginRefSchema,
  schedulingProfileSchema,
  type FlowControlSection,
  type RawConfigKey,
} from './schema.js';
import type { LoadedConfig, PluginSpec, ProfilePluginRef, SchedulingProfileConfig, SluiceConfig } from './types.js';
import { formatQuantity } from './units.js';
import { ENGINE_LABEL, KNOWN_ROLES, LEGACY_ENGINE_LABEL, ROLE_LABEL, engineLabelOf, roleOf, stageOf } from '../datalayer/endpoint.js';

export type PathSegment = string | number;

export interface ConfigProblem {
  file: string;
  line: number;
  col: number;
  /** e.g. `plugins[2].parameters.headroom`; '' for the whole file (syntax errors). */
  path: string;
  message: string;
}

export function formatProblem(p: ConfigProblem): string {
  return p.path === '' ? `${p.file}:${p.line}:${p.col}: ${p.message}` : `${p.file}:${p.line}:${p.col}: ${p.path}: ${p.message}`;
}

export class ConfigError extends Error {
  readonly problems: ConfigProblem[];
  constructor(problems: ConfigProblem[]) {
    super(problems.map(formatProblem).join('\n'));
    this.name = 'ConfigError';
    this.problems = problems;
  }

  /** One `FILE:LINE:COL: path: message` line per problem, newline-separated. */
  format(): string {
    return this.problems.map(formatProblem).join('\n');
  }
}

/** The loaded config plus non-fatal findings (deprecations, ignored llm-d blocks), same format as problems. */
export interface LoadResult extends LoadedConfig {
  warnings: ConfigProblem[];
  /** The document sets nothing (empty, only comments, `---`, `~`, `{}`): every default, no endpoints. */
  empty?: boolean;
}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_-]*$/;

/** `['plugins', 2, 'parameters', 'headroom']` → `plugins[2].parameters.headroom`. */
export function formatPath(path: readonly PathSegment[]): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else if (IDENTIFIER.test(seg)) out += out === '' ? seg : `.${seg}`;
    else out += `[${JSON.stringify(seg)}]`;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Positions

interface RangedNode {
  range?: [number, number, number] | null;
}

function startOf(node: unknown): number | undefined {
  const range = (node as RangedNode | null | undefined)?.range;
  return range ? range[0] : undefined;
}

/** Maps a data path to the position of its YAML node (or the closest existing ancestor). */
class Locator {
  constructor(
    private readonly doc: Document.Parsed | undefined,
    private readonly lines: LineCounter,
  ) {}

  /** Where `path` was written (or the deepest part of it that was), and whether all of it was. */
  private walk(path: readonly PathSegment[], atKey: boolean): { offset: number; found: boolean } {
    if (!this.doc) return { offset: 0, found: false };
    let node: unknown = this.doc.contents;
    let offset = startOf(node) ?? 0;
    for (let i = 0; i < path.length; i++) {
      const seg = path[i]!;
      if (isAlias(node)) node = node.resolve(this.doc);
      if (isMap(node)) {
        const pair = node.items.find((p) => (isScalar(p.key) ? String(p.key.value) : String(p.key)) === String(seg));
        if (!pair) return { offset, found: false };
        const keyStart = startOf(pair.key);
        if (atKey && i === path.length - 1) return { offset: keyStart ?? offset, found: true };
        node = pair.value;
        const valueStart = startOf(node);
        // A key with no value (`pool:`) has no useful value position: point at the key.
        offset = valueStart !== undefined && !(isScalar(node) && node.value === null) ? valueStart : keyStart ?? offset;
      } else if (isSeq(node) && typeof seg === 'number' && seg < node.items.length) {
        node = node.items[seg];
        offset = startOf(node) ?? offset;
      } else return { offset, found: false };
    }
    return { offset, found: true };
  }

  /** Whether the file itself holds `path` (not a value the loader filled in or copied there). */
  written(path: readonly PathSegment[]): boolean {
    return this.walk(path, true).found;
  }

  position(path: readonly PathSegment[], atKey = false): { line: number; col: number } {
    return this.lines.linePos(this.walk(path, atKey).offset);
  }
}

// ---------------------------------------------------------------------------------------------
// zod introspection (for "did you mean" on unknown keys)

interface ZodInternals {
  _zod: {
    def: {
      type: string;
      innerType?: ZodInternals;
      in?: ZodInternals;
      out?: ZodInternals;
      shape?: Record<string, ZodInternals>;
      element?: ZodInternals;
      valueType?: ZodInternals;
      options?: ZodInternals[];
      getter?: () => ZodInternals;
    };
  };
}

function unwrap(schema: ZodInternals | undefined): ZodInternals | undefined {
  let s = schema;
  for (let guard = 0; s && guard < 32; guard++) {
    const def = s._zod.def;
    if (def.innerType) s = def.innerType;
    else if (def.type === 'pipe') s = def.in && def.in._zod.def.type !== 'transform' ? def.in : def.out;
    else if (def.type === 'lazy' && def.getter) s = def.getter();
    else return s;
  }
  return s;
}

/** Keys the schema accepts at `path` (for suggestions), or [] if it is not an object there. */
function knownKeysAt(schema: unknown, path: readonly PathSegment[]): string[] {
  let s = unwrap(schema as ZodInternals);
  for (const seg of path) {
    if (!s) return [];
    const def = s._zod.def;
    if (def.type === 'object' && def.shape) s = unwrap(def.shape[String(seg)]);
    else if (def.type === 'array') s = unwrap(def.element);
    else if (def.type === 'record') s = unwrap(def.valueType);
    else if (def.type === 'union' && def.options) {
      const found = def.options.map((o) => knownKeysAt(o, [seg])).find((k) => k.length > 0);
      return found ?? [];
    } else return [];
  }
  const def = s?._zod.def;
  return def?.type === 'object' && def.shape ? Object.keys(def.shape) : [];
}

function unknownKeyMessage(key: string, known: readonly string[]): string {
  const suggestion = didYouMean(key, known);
  if (suggestion) return `unknown key "${key}"${suggestion}`;
  return known.length > 0 ? `unknown key "${key}" (valid keys: ${known.join(', ')})` : `unknown key "${key}"`;
}

// ---------------------------------------------------------------------------------------------
// The loader

type Outcome<T> = { ok: true; value: T } | { ok: false };

class ProblemSink {
  readonly problems: ConfigProblem[] = [];
  readonly warnings: ConfigProblem[] = [];
  constructor(
    private readonly file: string,
    private readonly locator: Locator,
  ) {}

  private make(path: readonly PathSegment[], message: string, atKey: boolean): ConfigProblem {
    const { line, col } = this.locator.position(path, atKey);
    return { file: this.file, line, col, path: formatPath(path), message };
  }

  error(path: readonly PathSegment[], message: string, atKey = false): void {
    this.problems.push(this.make(path, message, atKey));
  }

  warn(path: readonly PathSegment[], message: string, atKey = false): void {
    this.warnings.push(this.make(path, message, atKey));
  }

  written(path: readonly PathSegment[]): boolean {
    return this.locator.written(path);
  }

  /**
   * Validates `value` (found at `base`) against `schema`, reporting every issue. `written` maps an
   * issue's path to where it was written, when the schema moves keys.
   */
  parse<T>(schema: z.ZodType<T>, value: unknown, base: readonly PathSegment[], prefix = '', written?: (path: PathSegment[]) => PathSegment[]): Outcome<T> {
    const result = schema.safeParse(value, { error: configIssueMessage, reportInput: true });
    if (result.success) return { ok: true, value: result.data };
    for (const issue of result.error.issues) {
      const path = [...base, ...(written ? written(issue.path as PathSegment[]) : (issue.path as PathSegment[]))];
      if (issue.code === 'unrecognized_keys') {
        const known = knownKeysAt(schema, issue.path as PathSegment[]);
        for (const key of issue.keys) this.error([...path, key], prefix + unknownKeyMessage(key, known), true);
      } else {
        this.error(path, prefix + issue.message);
      }
    }
    return { ok: false };
  }
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** YAML `key:` with no value means "not set" (as in Kubernetes decoding), so drop nulls in mappings. */
function dropNullValues(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(dropNullValues);
  if (isPlainObject(v)) {
    const out: Record<string, unknown> = {};
    for (const [k, val] of Object.entries(v)) {
      if (val === null) continue;
      // A `__proto__` key must stay a key (and so an unknown one), not set the mapping's prototype.
      if (k === '__proto__') Object.defineProperty(out, k, { value: dropNullValues(val), enumerable: true, writable: true, configurable: true });
      else out[k] = dropNullValues(val);
    }
    return out;
  }
  return v;
}

function firstLine(message: string): string {
  return message.split('\n')[0]!.trim();
}

/**
 * Plain hints for the YAML errors a mis-indented line causes. A line indented too far is read as the
 * continuation of the value above it, so the error points at that value (MULTILINE_IMPLICIT_KEY).
 */
const YAML_HINTS: Partial<Record<ErrorCode, string>> = {
  BAD_INDENT: 'check the indentation of this line',
  MULTILINE_IMPLICIT_KEY: 'check the indentation of this line and the lines below it, and for a missing ":" after a key',
};

const SECTIONS = rawConfigSchema.shape;
const SECTION_KEYS = Object.keys(SECTIONS) as RawConfigKey[];

/** Loads a config from text (YAML or JSON). Throws ConfigError listing every problem. */
export function loadConfigText(text: string, file: string, registry: PluginRegistry): LoadResult {
  const lineCounter = new LineCounter();
  // merge: YAML merge keys (`<<: *anchor`), which llm-d's Kubernetes YAML decoder expands too.
  const doc = parseDocument(text, { lineCounter, prettyErrors: false, uniqueKeys: true, merge: true });
  const sink = new ProblemSink(file, new Locator(doc, lineCounter));
  // A trailing `---` with nothing after it (common in generated Kubernetes YAML) is not a second document.
  if (doc.errors.some((e) => e.code === 'MULTIPLE_DOCS')) {
    const all = parseAllDocuments(text, { merge: true });
    if (Array.isArray(all) && all.slice(1).every((d) => d.errors.length === 0 && d.toJS() == null)) {
      doc.errors = doc.errors.filter((e) => e.code !== 'MULTIPLE_DOCS');
    }
  }

  if (doc.errors.length > 0) {
    // One mistake often yields several errors at the same place: report the place once, with the
    // first message and a hint from any of them.
    const byOffset = new Map<number, YAMLError[]>();
    for (const err of doc.errors) byOffset.set(err.pos[0], [...(byOffset.get(err.pos[0]) ?? []), err]);
    for (const [offset, errors] of byOffset) {
      const { line, col } = lineCounter.linePos(offset);
      const hint = errors.map((err) => YAML_HINTS[err.code]).find((h) => h !== undefined);
      // The parser's own text for this one names a JavaScript function.
      const code = errors[0]!.code;
      const what =
        code === 'MULTIPLE_DOCS'
          ? 'a second YAML document (after "---"): the file must hold one'
          : code === 'DUPLICATE_KEY'
            ? `duplicate key ${JSON.stringify(/^[^:\n]*/.exec(text.slice(offset))![0].trim())} (a mapping holds each key once)`
            : firstLine(errors[0]!.message);
      const message = `YAML syntax error: ${what}${hint === undefined ? '' : ` — ${hint}`}`;
      sink.problems.push({ file, line, col, path: '', message });
    }
    throw new ConfigError(sortProblems(sink.problems));
  }
  for (const w of doc.warnings) {
    const { line, col } = lineCounter.linePos(w.pos[0]);
    sink.warnings.push({ file, line, col, path: '', message: `YAML: ${firstLine(w.message)}` });
  }

  let raw: unknown;
  try {
    raw = dropNullValues(doc.toJS({ maxAliasCount: 1000 }));
  } catch (err) {
    // toJS knows no positions: find the node it stumbled on where we can.
    const offset = badMergeOffset(doc);
    if (offset === undefined) sink.error([], `cannot read YAML: ${(err as Error).message}`);
    else {
      const { line, col } = lineCounter.linePos(offset);
      sink.problems.push({ file, line, col, path: '', message: `cannot read YAML: ${firstLine((err as Error).message)}` });
    }
    throw new ConfigError(sink.problems);
  }
  if (raw === undefined || raw === null) raw = {};
  const empty = isPlainObject(raw) && Object.keys(raw).length === 0;
  if (!isPlainObject(raw)) {
    sink.error([], `expected a mapping (an EndpointPickerConfig), got ${describeValue(raw)}`);
    throw new ConfigError(sink.problems);
  }

  const { config, pluginState, flowControlValid, detectorRefPath } = parseSections(raw, registry, sink);
  applyPluginSettings(raw, config, registry, sink, pluginState.invalidNames);
  const ensured = ensure(config, registry);
  checkReferences(raw, ensured.config, registry, sink, pluginState, flowControlValid, detectorRefPath);
  collectWarnings(raw, ensured.config, sink);
  if (sink.problems.length === 0) {
    collectPluginWarnings(raw, ensured.config, registry, sink);
    collectEmptyProfileWarnings(raw, ensured.config, registry, sink);
  }

  if (sink.problems.length > 0) throw new ConfigError(sortProblems(sink.problems));
  return { file, config: ensured.config, injections: ensured.injections, warnings: sortProblems(sink.warnings), ...(empty ? { empty } : {}) };
}

/** Reads and loads a config file; a read failure is a ConfigError too. */
export function loadConfigFile(path: string, registry: PluginRegistry): LoadResult {
  return loadConfigText(readConfigFile(path), path, registry);
}

/** The file's text; a ConfigError naming the file when it cannot be read or is not UTF-8 text. */
export function readConfigFile(path: string): string {
  let bytes: Buffer;
  try {
    bytes = readFileSync(path);
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const reason = e.code === 'ENOENT' ? 'no such file' : e.message;
    throw new ConfigError([{ file: path, line: 1, col: 1, path: '', message: `cannot read config file: ${reason}` }]);
  }
  return decodeConfigText(bytes, path);
}

/**
 * UTF-8 text (YAML's default); UTF-16 with a byte-order mark is decoded too, as Kubernetes' YAML
 * reader does. Invalid UTF-8 is an error at its line and column rather than U+FFFD in a name.
 */
export function decodeConfigText(bytes: Buffer, file: string): string {
  if (bytes.length >= 2 && bytes[0] === 0xff && bytes[1] === 0xfe) return new TextDecoder('utf-16le').decode(bytes);
  if (bytes.length >= 2 && bytes[0] === 0xfe && bytes[1] === 0xff) return new TextDecoder('utf-16be').decode(bytes);
  const bad = firstInvalidUtf8(bytes);
  if (bad < 0) return bytes.toString('utf8');
  const before = bytes.subarray(0, bad);
  const lineStart = before.lastIndexOf(0x0a) + 1;
  const line = before.reduce((n, b) => (b === 0x0a ? n + 1 : n), 1);
  const col = before.subarray(lineStart).toString('utf8').length + 1;
  const hex = bytes[bad]!.toString(16).toUpperCase().padStart(2, '0');
  throw new ConfigError([{ file, line, col, path: '', message: `the file is not UTF-8 text: invalid byte 0x${hex} (save it as UTF-8)` }]);
}

/** Offset of the first byte that does not belong to a well-formed UTF-8 sequence, or -1. */
function firstInvalidUtf8(b: Uint8Array): number {
  for (let i = 0; i < b.length; ) {
    const c = b[i]!;
    if (c < 0x80) {
      i++;
      continue;
    }
    // Lead byte → continuation count and the allowed range of the first continuation byte
    // (which excludes overlong forms, surrogates and code points past U+10FFFF).
    let n: number;
    let lo = 0x80;
    let hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) n = 1;
    else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c === 0xe0) lo = 0xa0;
      else if (c === 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c === 0xf0) lo = 0x90;
      else if (c === 0xf4) hi = 0x8f;
    } else return i;
    for (let k = 1; k <= n; k++) {
      const x = b[i + k];
      if (x === undefined || x < (k === 1 ? lo : 0x80) || x > (k === 1 ? hi : 0xbf)) return i;
    }
    i += n + 1;
  }
  return -1;
}

function sortProblems(problems: ConfigProblem[]): ConfigProblem[] {
  return [...problems].sort((a, b) => a.line - b.line || a.col - b.col);
}

// ---------------------------------------------------------------------------------------------
// Sections

interface PluginState {
  /** Names of plugins whose declaration is broken (already reported): refs to them are not re-reported. */
  invalidNames: Set<string>;
  /** Plugins declared in the file (the rest were injected). */
  declaredCount: number;
  /** Whether plugins[i] spelled out a `name` (else the name came from `type`). */
  explicitName: boolean[];
}

function stringAt(v: unknown, key: string): string | undefined {
  return isPlainObject(v) && typeof v[key] === 'string' && v[key] !== '' ? v[key] : undefined;
}

function parseSections(raw: Record<string, unknown>, registry: PluginRegistry, sink: ProblemSink) {
  for (const key of Object.keys(raw)) {
    if (!(SECTION_KEYS as string[]).includes(key)) sink.error([key], unknownKeyMessage(key, SECTION_KEYS), true);
  }

  /** Parses one top-level section; on failure returns its defaults so later checks can go on. */
  const section = <K extends RawConfigKey>(key: K): { value: z.output<(typeof SECTIONS)[K]>; ok: boolean } => {
    const schema = SECTIONS[key] as unknown as z.ZodType<z.output<(typeof SECTIONS)[K]>>;
    const outcome = sink.parse(schema, raw[key], [key]);
    if (outcome.ok) return { value: outcome.value, ok: true };
    return { value: schema.parse(undefined), ok: false };
  };

  const apiVersion = section('apiVersion').value;
  const kind = section('kind').value;
  const server = section('server').value;
  const pool = section('pool').value;
  const objectives = section('objectives').value;
  const featureGates = section('featureGates').value;
  const flowControl = section('flowControl');
  const topDetector = section('saturationDetector');
  section('dataLayer');
  section('requestHandler');
  section('parser');

  const pluginState: PluginState = { invalidNames: new Set(), declaredCount: 0, explicitName: [] };
  const plugins = parsePlugins(raw.plugins, registry, sink, pluginState);
  const schedulingProfiles = parseProfiles(raw.schedulingProfiles, sink);

  // The deprecated top-level detector is used only when the nested one is unset (reference §1.2).
  const fc: FlowControlSection = flowControl.value;
  let detectorRefPath: PathSegment[] = ['flowControl', 'saturationDetector', 'pluginRef'];
  let saturationDetector = fc.saturationDetector;
  if ((!saturationDetector || saturationDetector.pluginRef === '') && topDetector.value?.pluginRef) {
    saturationDetector = topDetector.value;
    detectorRefPath = ['saturationDetector', 'pluginRef'];
  }
  const config: SluiceConfig = {
    apiVersion,
    kind,
    server,
    pool,
    objectives,
    featureGates,
    plugins,
    schedulingProfiles,
    flowControl: { ...fc, saturationDetector: saturationDetector ?? { pluginRef: '' } },
  };
  return { config, pluginState, flowControlValid: flowControl.ok && topDetector.ok, detectorRefPath };
}

function parsePlugins(value: unknown, registry: PluginRegistry, sink: ProblemSink, state: PluginState): PluginSpec[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) {
    sink.parse(SECTIONS.plugins, value, ['plugins']);
    return [];
  }
  state.declaredCount = value.length;
  // Whether the user named each plugin (before lending may name a lender it turns into another type).
  const named = value.map((entry: unknown) => stringAt(entry, 'name') !== undefined);
  lendParameters(value, registry, sink);
  return value.map((entry: unknown, i): PluginSpec => {
    const path = ['plugins', i];
    const rawType = stringAt(entry, 'type') ?? '';
    const rawName = stringAt(entry, 'name') ?? rawType;
    state.explicitName[i] = named[i]!;
    // Broken entries stay in the list as placeholders so later indexes still match the file.
    const placeholder: PluginSpec = { type: rawType, name: rawName, parameters: {} };
    const spec = sink.parse(pluginSpecSchema, entry, path);
    if (!spec.ok) {
      state.invalidNames.add(rawName);
      return placeholder;
    }
    const { type, parameters } = spec.value;
    const name = spec.value.name ?? type;
    const def = registry.get(type);
    if (!def) {
      sink.error([...path, 'type'], unknownPluginTypeMessage(type, registry.types()));
      state.invalidNames.add(name);
      return { type, name, parameters: parameters ?? {} };
    }
    const written = def.writtenPath && ((p: PathSegment[]) => def.writtenPath!(parameters, p));
    const params = sink.parse(def.params, parameters ?? {}, [...path, 'parameters'], `plugin "${name}" (${type}): `, written);
    if (!params.ok) {
      state.invalidNames.add(name);
      return { type, name, parameters: parameters ?? {} };
    }
    return { type, name, parameters: (params.value ?? {}) as Record<string, unknown> };
  });
}

/**
 * Copies the parameters of plugins that lend them (PluginDefinition.lendsParameters) into their
 * borrowers, in place; a lender nobody borrows from becomes a plugin of the type it lends to. The
 * borrowers are the entries declared with that type: a lender renamed here borrows from no one.
 */
function lendParameters(entries: unknown[], registry: PluginRegistry, sink: ProblemSink): void {
  const declaredType = entries.map((entry) => stringAt(entry, 'type'));
  const renames: (() => void)[] = [];
  entries.forEach((lender, i) => {
    const type = declaredType[i];
    const def = type === undefined ? undefined : registry.get(type);
    const lends = def?.lendsParameters;
    if (lends === undefined || !isPlainObject(lender)) return;
    const name = stringAt(lender, 'name') ?? type;
    const lent = isPlainObject(lender.parameters) ? lender.parameters : {};
    // Invalid parameters are reported once, at the lender: the borrowers keep their own.
    if (!def!.params.safeParse(lent).success) return;
    const borrowers: string[] = [];
    entries.forEach((entry, j) => {
      if (!isPlainObject(entry) || declaredType[j] !== lends.to) return;
      const own = isPlainObject(entry.parameters) ? entry.parameters : {};
      const ref = own[lends.referencedBy];
      if (ref !== undefined && ref !== name) return;
      entry.parameters = { ...lent, ...own };
      borrowers.push(stringAt(entry, 'name') ?? lends.to);
    });
    if (borrowers.length > 0) {
      sink.warn(
        ['plugins', i, 'type'],
        `${type}: its parameters apply to ${borrowers.map((b) => `"${b}"`).join(', ')} (in Sluice the ${lends.to} keeps the index itself)`,
      );
      return;
    }
    // Nothing borrows them: the lender does the work itself, as the type it lends to (after every
    // lender has lent, so that no lender borrows from another).
    renames.push(() => {
      lender.type = lends.to;
      // An invalid name stays, to be reported where it was written.
      if (!('name' in lender)) lender.name = type;
    });
    sink.warn(['plugins', i, 'type'], `${type}: no ${lends.to} uses it, so it runs as a ${lends.to} named "${name}" (keeping the index; it scores only in profiles that reference it)`);
  });
  for (const rename of renames) rename();
}

function parseProfiles(value: unknown, sink: ProblemSink): SchedulingProfileConfig[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) {
    sink.parse(SECTIONS.schedulingProfiles, value, ['schedulingProfiles']);
    return [];
  }
  return value.map((entry: unknown, i): SchedulingProfileConfig => {
    const parsed = sink.parse(schedulingProfileSchema, entry, ['schedulingProfiles', i]);
    if (parsed.ok) return parsed.value;
    // A placeholder keeps indexes aligned. It keeps the refs that parse, so a dangling one among
    // them is reported now too; a broken ref ('' : skipped) adds no follow-up error.
    const refs = isPlainObject(entry) && Array.isArray(entry.plugins) ? entry.plugins : [];
    const plugins = refs.map((ref: unknown): ProfilePluginRef => {
      const r = profilePluginRefSchema.safeParse(ref);
      return r.success ? r.data : { pluginRef: '' };
    });
    return { name: stringAt(entry, 'name') ?? '', plugins, saturationFilter: false };
  });
}

// ---------------------------------------------------------------------------------------------
// Cross-reference checks (after ensure, so injected plugins count as declared)

const KIND_NAMES: Record<PluginKind, string> = {
  filter: 'filter',
  scorer: 'scorer',
  picker: 'picker',
  profileHandler: 'profile handler',
  saturationDetector: 'saturation detector',
  decider: 'decider',
  fairnessPolicy: 'fairness policy',
  orderingPolicy: 'ordering policy',
  usageLimitPolicy: 'usage-limit policy',
};

function checkReferences(
  raw: Record<string, unknown>,
  config: SluiceConfig,
  registry: PluginRegistry,
  sink: ProblemSink,
  state: PluginState,
  flowControlValid: boolean,
  detectorRefPath: PathSegment[],
): void {
  const byName = new Map<string, { spec: PluginSpec; index: number }>();
  const namePathOf = (index: number): PathSegment[] => ['plugins', index, state.explicitName[index] ? 'name' : 'type'];
  config.plugins.forEach((spec, index) => {
    if (index >= state.declaredCount && !registry.has(spec.type)) {
      sink.error(['plugins'], `injected plugin type "${spec.type}" is not registered (internal error)`);
    }
    if (spec.name === '') return;
    const first = byName.get(spec.name);
    if (!first) byName.set(spec.name, { spec, index });
    else if (index >= state.declaredCount) {
      // Injected (§3.6): only the declared one is in the file, so it is named there.
      sink.error(namePathOf(first.index), `plugin name "${spec.name}" is taken: Sluice adds a ${spec.type} of that name (the default it injects when none is configured); rename this ${first.spec.type}`);
    } else sink.error(namePathOf(index), `duplicate plugin name "${spec.name}" (first declared at plugins[${first.index}])`);
  });
  const names = [...byName.keys()];

  /** What a dangling ref probably meant; naming a plugin type instead of a plugin is a common slip. */
  const missingPluginHint = (ref: string, kinds: PluginKind[]): string => {
    const ofType = config.plugins.find((spec) => spec.type === ref);
    if (ofType) return ` (did you mean "${ofType.name}", the plugin of type ${ref}?)`;
    if (kinds.some((k) => registry.is(ref, k))) return ` (it is a plugin type: declare it under plugins: with "- type: ${ref}")`;
    return didYouMean(ref, names);
  };

  /** Resolves a ref; reports a dangling ref or a wrong kind. Returns the plugin if usable. */
  const resolve = (ref: string, path: PathSegment[], kinds: PluginKind[], usage: string): PluginSpec | undefined => {
    const target = byName.get(ref);
    if (!target) {
      if (!state.invalidNames.has(ref)) sink.error(path, `no plugin named "${ref}" is declared${missingPluginHint(ref, kinds)}`);
      return undefined;
    }
    const { spec } = target;
    if (state.invalidNames.has(spec.name) || !registry.has(spec.type)) return undefined;
    if (!kinds.some((k) => registry.is(spec.type, k))) {
      const wanted = kinds.map((k) => KIND_NAMES[k]);
      const list = wanted.length > 1 ? `${wanted.slice(0, -1).join(', ')} or ${wanted[wanted.length - 1]}` : wanted[0]!;
      if (!rawHas(raw, path) && target.index < state.declaredCount) {
        // A default ref (not in the file) found a declared plugin that took the default's name.
        sink.error(namePathOf(target.index), `plugin name "${spec.name}" is taken: ${formatPath(path)} refers to it by default, for ${usage}; rename this ${spec.type}`);
      } else sink.error(path, `plugin "${spec.name}" (${spec.type}) cannot be used as ${usage}: it is not ${/^[aeio]/.test(list) ? 'an' : 'a'} ${list}`);
      return undefined;
    }
    return spec;
  };

  // Profiles
  const profileNames = new Map<string, number>();
  config.schedulingProfiles.forEach((profile, p) => {
    if (profile.name !== '') {
      const first = profileNames.get(profile.name);
      if (first !== undefined) {
        sink.error(['schedulingProfiles', p, 'name'], `duplicate profile name "${profile.name}" (first declared at schedulingProfiles[${first}])`);
      } else profileNames.set(profile.name, p);
    }
    let picker: string | undefined;
    profile.plugins.forEach((ref, r) => {
      if (ref.pluginRef === '') return; // a broken ref of a broken profile, already reported
      const path = ['schedulingProfiles', p, 'plugins', r, 'pluginRef'];
      const spec = resolve(ref.pluginRef, path, ['filter', 'scorer', 'picker'], `a profile plugin`);
      if (!spec || !registry.is(spec.type, 'picker')) return;
      if (picker !== undefined) {
        sink.error(path, `profile "${profile.name}" has more than one picker ("${picker}" and "${spec.name}")`);
      } else picker = spec.name;
    });
  });

  // Names inside plugin parameters (e.g. a disagg handler's profiles and decider)
  config.plugins.forEach((spec, index) => {
    const def = registry.get(spec.type);
    if (!def?.references || state.invalidNames.has(spec.name)) return;
    const rawParams = index < state.declaredCount ? (raw.plugins as { parameters?: unknown }[] | undefined)?.[index]?.parameters : undefined;
    for (const ref of def.references(spec.parameters)) {
      const path: PathSegment[] = ['plugins', index, 'parameters', ...(def.writtenPath ? def.writtenPath(rawParams, ref.path) : ref.path)];
      if (ref.to === 'plugin') resolve(ref.name, path, [...ref.kinds], ref.usage);
      else if (!profileNames.has(ref.name)) {
        sink.error(path, `no scheduling profile named "${ref.name}"${didYouMean(ref.name, [...profileNames.keys()])}`);
      }
    }
  });

  // Profile handlers
  const handlers = config.plugins
    .map((spec, index) => ({ spec, index }))
    .filter(({ spec }) => registry.is(spec.type, 'profileHandler'));
  handlers.slice(1).forEach(({ spec, index }) => {
    sink.error(
      ['plugins', index, 'type'],
      `more than one profile handler ("${handlers[0]!.spec.name}" and "${spec.name}"); at most one is allowed`,
    );
  });
  const profileCount = config.schedulingProfiles.length;
  for (const { spec, index } of handlers) {
    if (spec.type === 'single-profile-handler' && profileCount > 1) {
      sink.error(
        ['plugins', index, 'type'],
        `single-profile-handler "${spec.name}" cannot run ${profileCount} profiles; use a handler that chooses between profiles (e.g. disagg-profile-handler) or keep one profile`,
      );
    }
  }
  if (handlers.length === 0 && profileCount > 1) {
    sink.error(
      ['schedulingProfiles'],
      `${profileCount} profiles but no profile handler plugin; declare one that chooses between them (e.g. disagg-profile-handler)`,
    );
  }

  // Flow control (skipped when the block itself is broken: already reported)
  if (!flowControlValid) return;
  const fc = config.flowControl;
  resolve(fc.saturationDetector.pluginRef, detectorRefPath, ['saturationDetector'], 'the saturation detector');
  resolve(fc.usageLimitPolicyPluginRef, ['flowControl', 'usageLimitPolicyPluginRef'], ['usageLimitPolicy'], 'the usage-limit policy');
  const bands: [PathSegment[], { fairnessPolicyRef: string; orderingPolicyRef: string }][] = [
    [['flowControl', 'defaultPriorityBand'], fc.defaultPriorityBand],
    ...(fc.defaultNegativePriorityBand
      ? [[['flowControl', 'defaultNegativePriorityBand'], fc.defaultNegativePriorityBand] as [PathSegment[], typeof fc.defaultPriorityBand]]
      : []),
    ...fc.priorityBands.map((b, i): [PathSegment[], typeof b] => [['flowControl', 'priorityBands', i], b]),
  ];
  for (const [path, band] of bands) {
    resolve(band.fairnessPolicyRef, [...path, 'fairnessPolicyRef'], ['fairnessPolicy'], 'a fairness policy');
    resolve(band.orderingPolicyRef, [...path, 'orderingPolicyRef'], ['orderingPolicy'], 'an ordering policy');
  }
}

// ---------------------------------------------------------------------------------------------
// Warnings

/**
 * Applies the settings plugin parameters stand for (PluginDefinition.standsFor) to `config`. A
 * setting the user also wrote, or that two plugins set, must get one value: else an error at the
 * plugin's parameter.
 */
function applyPluginSettings(
  raw: Record<string, unknown>,
  config: SluiceConfig,
  registry: PluginRegistry,
  sink: ProblemSink,
  invalidNames: ReadonlySet<string>,
): void {
  const setBy = new Map<string, { value: unknown; written: string; where: string }>();
  config.plugins.forEach((spec, i) => {
    const def = registry.get(spec.type);
    // A plugin whose parameters did not parse has none to apply (its error is reported).
    if (def?.standsFor === undefined || invalidNames.has(spec.name)) return;
    for (const { parameter, setting, value, written } of def.standsFor(spec.parameters ?? {})) {
      const key = setting.join('.');
      const here = ['plugins', i, 'parameters', parameter];
      const earlier =
        setBy.get(key) ?? (rawHas(raw, setting) ? { value: valueAt(config, setting), written: String(valueAt(raw, setting)), where: key } : undefined);
      if (earlier !== undefined && earlier.value !== value) {
        sink.error(here, `sets ${key} to ${written}, but ${earlier.where} sets ${earlier.written}: give it once`);
        continue;
      }
      setBy.set(key, { value, written, where: `plugin "${spec.name}"` });
      setValueAt(config, setting, value);
    }
  });
}

/** The value at `path` in a parsed or raw configuration (undefined when any step is missing). */
function valueAt(root: unknown, path: readonly PathSegment[]): unknown {
  let node = root;
  for (const seg of path) {
    if (Array.isArray(node) && typeof seg === 'number') node = node[seg];
    else if (isPlainObject(node)) node = node[String(seg)];
    else return undefined;
  }
  return node;
}

function setValueAt(root: object, path: readonly string[], value: unknown): void {
  const parent = valueAt(root, path.slice(0, -1));
  if (isPlainObject(parent)) parent[path.at(-1)!] = value;
}

/** `true` when the user's document sets the value at `path`. */
function rawHas(raw: Record<string, unknown>, path: readonly PathSegment[]): boolean {
  return valueAt(raw, path) !== undefined;
}

/**
 * Each plugin's own checks against the rest of the configuration (PluginDefinition.configWarnings),
 * shown at the conflicting setting when the user wrote it, else at the plugin's parameter.
 */
function collectPluginWarnings(raw: Record<string, unknown>, config: SluiceConfig, registry: PluginRegistry, sink: ProblemSink): void {
  const rawPlugins = Array.isArray(raw.plugins) ? raw.plugins : [];
  const declaredNames = new Set(rawPlugins.map((p) => (isPlainObject(p) ? (p.name ?? p.type) : undefined)).filter((n): n is string => typeof n === 'string'));
  const context = { metricsIntervalMs: config.pool.metrics.interval, declaredNames, profileNames: new Set(config.schedulingProfiles.map((p) => p.name)) };
  for (const spec of config.plugins) {
    const def = registry.get(spec.type);
    if (def?.configWarnings === undefined) continue;
    const index = rawPlugins.findIndex((p) => isPlainObject(p) && (p.name ?? p.type) === spec.name);
    // Only called on a config without problems: every plugin's parameters are parsed, defaults filled.
    for (const w of def.configWarnings(spec.parameters ?? {}, context)) {
      if (w.whereWritten === true && (index < 0 || !sink.written(['plugins', index, 'parameters', w.parameter ?? '']))) continue;
      const at: readonly PathSegment[] =
        w.setting !== undefined && rawHas(raw, w.setting)
          ? w.setting
          : index >= 0
            ? ['plugins', index, 'parameters', ...(w.parameter !== undefined ? [w.parameter] : [])]
            : (w.setting ?? ['plugins']);
      sink.warn(at, w.message);
    }
  }
}

/**
 * A profile whose label filters (PluginDefinition.keepsByLabels) keep none of the endpoints in
 * pool.endpoints never picks one: a P/D prefill profile then serves every request decode-only, any
 * other refuses its requests. Most often a role label missing or misspelt. A profile the user wrote
 * is warned at its name; the one built from the declared plugins (no schedulingProfiles) at the
 * filter that keeps none. Without such a mistake, the endpoints no profile keeps are warned about
 * next (collectUnreachedStageWarning).
 */
function collectEmptyProfileWarnings(raw: Record<string, unknown>, config: SluiceConfig, registry: PluginRegistry, sink: ProblemSink): void {
  const endpoints = config.pool.endpoints;
  if (endpoints.length === 0) return;
  const specs = new Map(config.plugins.map((s) => [s.name, s]));
  const written = Array.isArray(raw.schedulingProfiles) ? raw.schedulingProfiles : [];
  const rawPlugins = Array.isArray(raw.plugins) ? raw.plugins : [];
  /** Indexes of the endpoints some profile's label filters keep. */
  const reached = new Set<number>();
  let warned = false;
  for (const profile of config.schedulingProfiles) {
    const writtenAt = written.findIndex((p) => isPlainObject(p) && p.name === profile.name);
    let kept = endpoints.map((_, i) => i);
    let filtered = false;
    for (const { pluginRef } of profile.plugins) {
      const spec = specs.get(pluginRef);
      const keeps = spec === undefined ? undefined : registry.get(spec.type)?.keepsByLabels;
      if (keeps === undefined) continue;
      kept = kept.filter((i) => keeps(spec!.parameters, endpoints[i]!.labels));
      if (kept.length > 0) {
        filtered = true;
        continue;
      }
      if (writtenAt < 0 && written.length > 0) break; // injected beside written ones: not the user's to fix
      const pluginAt = rawPlugins.findIndex((p) => isPlainObject(p) && (p.name ?? p.type) === pluginRef);
      const n = endpoints.length;
      sink.warn(
        writtenAt >= 0 ? ['schedulingProfiles', writtenAt, 'name'] : pluginAt >= 0 ? ['plugins', pluginAt, 'type'] : ['plugins'],
        `profile ${JSON.stringify(profile.name)}${writtenAt >= 0 ? '' : ' (built from the plugins)'} can pick none of the ${n} endpoint${n === 1 ? '' : 's'} in pool.endpoints: ${pluginRef} keeps none${filtered ? ' of what the label filters before it keep' : ''} (check the endpoints' labels); the requests it should place are refused, or, if it is a P/D handler's prefill profile, all served decode-only`,
      );
      warned = true;
      break;
    }
    for (const i of kept) reached.add(i);
  }
  // One mistake, one warning: a profile that keeps none is the thing to fix first.
  if (!warned) collectUnreachedStageWarning(endpoints, reached, sink);
}

/**
 * Endpoints no profile can pick (e.g. prefill servers without a P/D handler) still count toward
 * their stage's saturation (SPEC §6): while one is busy or its metrics are stale, every request
 * waits for servers it will never be sent to. Said once, at the first of them.
 */
function collectUnreachedStageWarning(endpoints: SluiceConfig['pool']['endpoints'], reached: ReadonlySet<number>, sink: ProblemSink): void {
  const unreached = endpoints.flatMap((e, i) => (!reached.has(i) && stageOf(roleOf(e.labels)) !== null ? [i] : []));
  if (unreached.length === 0) return;
  const first = unreached[0]!;
  const names = unreached.slice(0, 5).map((i) => endpoints[i]!.name);
  const more = unreached.length > names.length ? ` and ${unreached.length - names.length} more` : '';
  const stages = [...new Set(unreached.map((i) => stageOf(roleOf(endpoints[i]!.labels))))].join(', ');
  const one = unreached.length === 1;
  const [they, them, their, are] = one ? ['it', 'it', 'its', 'is'] : ['they', 'them', 'their', 'are'];
  const at = sink.written(['pool', 'endpoints', first, 'labels', ROLE_LABEL]) ? ['pool', 'endpoints', first, 'labels', ROLE_LABEL] : ['pool', 'endpoints', first, 'name'];
  sink.warn(
    at,
    `no scheduling profile can pick ${names.join(', ')}${more} (every profile's label filters leave ${them} out), yet ${they} count${one ? 's' : ''} toward stage-aware saturation (stage ${stages}): while ${they} ${are} busy or ${their} metrics are stale, requests wait for servers they are never sent to (without flow control, sheddable ones are refused). Add a profile that picks ${them}, such as a P/D handler's prefill profile, or remove ${them} from pool.endpoints`,
  );
}

function collectWarnings(raw: Record<string, unknown>, config: SluiceConfig, sink: ProblemSink): void {
  if (config.pool.endpoints.length === 0) {
    sink.warn(
      ['pool', 'endpoints'],
      `no endpoints: every API request is answered 503 rejected-no-endpoints (with flow control, after waiting flowControl.noEndpointRequestTTL for a reload that adds some)`,
    );
  }
  config.pool.endpoints.forEach((ep, i) => {
    if (engineLabelOf(ep.labels) === LEGACY_ENGINE_LABEL) {
      sink.warn(['pool', 'endpoints', i, 'labels', LEGACY_ENGINE_LABEL], `a legacy label name, read as ${ENGINE_LABEL} (as llm-d does); rename it`);
    }
    const role = ep.labels[ROLE_LABEL];
    if (role !== undefined && !KNOWN_ROLES.includes(role)) {
      sink.warn(
        ['pool', 'endpoints', i, 'labels', ROLE_LABEL],
        `unknown role ${JSON.stringify(role)}${didYouMean(role, KNOWN_ROLES)}: read as the decode stage, and decode-filter and prefill-filter drop it`,
      );
    }
  });
  if (raw.apiVersion === DEPRECATED_API_VERSION) {
    sink.warn(['apiVersion'], `apiVersion ${DEPRECATED_API_VERSION} is deprecated; use ${API_VERSION}`);
  }
  if (Array.isArray(raw.featureGates)) {
    raw.featureGates.forEach((entry, i) => {
      const gate = typeof entry === 'string' ? parseFeatureGate(entry) : undefined;
      if (gate !== undefined && !(gate instanceof Error) && NO_EFFECT_FEATURE_GATES.has(gate.name)) {
        sink.warn(['featureGates', i], `feature gate "${gate.name}" (GIE) changes nothing in Sluice`);
      }
    });
  }
  if (raw.saturationDetector !== undefined) {
    // As the choice above: the nested one wins only when it names a detector.
    const nestedDetector = isPlainObject(raw.flowControl) ? raw.flowControl.saturationDetector : undefined;
    const nested = isPlainObject(nestedDetector) && typeof nestedDetector.pluginRef === 'string' && nestedDetector.pluginRef !== '';
    sink.warn(
      ['saturationDetector'],
      nested
        ? 'deprecated location, ignored because flowControl.saturationDetector is set'
        : 'deprecated location; move it to flowControl.saturationDetector',
      true,
    );
  }
  if (raw.dataLayer !== undefined) {
    sink.warn(['dataLayer'], 'ignored: Sluice scrapes each endpoint\'s metrics as configured in pool.metrics (a metrics-data-source\'s path and interval go there)', true);
  }
  if (raw.requestHandler !== undefined) {
    sink.warn(['requestHandler'], 'ignored: Sluice parses OpenAI requests itself', true);
  }
  if (raw.parser !== undefined) sink.warn(['parser'], 'ignored: Sluice parses OpenAI requests itself', true);
  const rawFlowControl = raw.flowControl;
  if (isPlainObject(rawFlowControl)) {
    if (rawFlowControl.enableEviction === true) {
      sink.warn(['flowControl', 'enableEviction'], 'in-flight eviction is not supported by Sluice; ignored');
    }
    const settings = Object.keys(rawFlowControl).filter((k) => k !== 'saturationDetector');
    if (featureEnabled(config, 'flowControl')) collectByteLimitWarnings(config, sink);
    else if (settings.length > 0) {
      sink.warn(
        ['flowControl'],
        `flow control is disabled by featureGates, so ${settings.join(', ')} ${settings.length === 1 ? 'is' : 'are'} ignored (only saturationDetector is used)`,
        true,
      );
    }
  }
}

/**
 * A queue byte limit under server.bodyLimit: a body between the two is accepted by the server and
 * refused by flow control at once, whatever the load (it can never be queued). Said at each limit
 * the user wrote.
 */
function collectByteLimitWarnings(config: SluiceConfig, sink: ProblemSink): void {
  const fc = config.flowControl;
  const bodyLimit = config.server.bodyLimit;
  const limits: [readonly PathSegment[], number][] = [
    [['flowControl', 'maxBytes'], fc.maxBytes],
    [['flowControl', 'defaultPriorityBand', 'maxBytes'], fc.defaultPriorityBand.maxBytes],
    [['flowControl', 'defaultNegativePriorityBand', 'maxBytes'], fc.defaultNegativePriorityBand?.maxBytes ?? 0],
    ...fc.priorityBands.map((b, i): [readonly PathSegment[], number] => [['flowControl', 'priorityBands', i, 'maxBytes'], b.maxBytes]),
  ];
  for (const [at, maxBytes] of limits) {
    if (maxBytes <= 0 || maxBytes >= bodyLimit || !sink.written(at)) continue;
    sink.warn(
      at,
      `${formatQuantity(maxBytes)} is below server.bodyLimit (${formatQuantity(bodyLimit)}): a request body larger than it is refused 429 at once, whatever the load, since it can never be queued; raise it to bodyLimit or lower bodyLimit`,
    );
  }
}

/** Where a merge key (`<<`) has a value other than a mapping, an alias of one, or a list of those. */
function badMergeOffset(doc: Document): number | undefined {
  let found: number | undefined;
  const mergeable = (node: unknown): boolean => isMap(node) || (isAlias(node) && isMap(node.resolve(doc)));
  visit(doc, {
    Pair(_key, pair) {
      // The parser gives a merge key (a plain `<<`, not a quoted one) a symbol as its value.
      const key = pair.key;
      if (!isScalar(key) || typeof key.value !== 'symbol' || key.value.description !== '<<') return undefined;
      const value = pair.value;
      const bad = isSeq(value) ? value.items.find((item) => !mergeable(item)) : mergeable(value) ? undefined : value;
      if (bad === undefined) return undefined;
      found = (isScalar(bad) || isMap(bad) || isSeq(bad) || isAlias(bad) ? bad.range?.[0] : undefined) ?? key.range?.[0];
      return visit.BREAK;
    },
  });
  return found;
}

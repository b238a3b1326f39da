/** Bad command-line arguments: the CLI prints the message and exits 1 (SPEC §1). */
export class UsageError extends Error {
  override name = 'UsageError';
}

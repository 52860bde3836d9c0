// Validate an AsyncAPI document with the official parser; exit 1 listing every problem.
// Usage: node validate.mjs path/to/asyncapi.yaml
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { Parser, fromFile } from "@asyncapi/parser";

const path = resolve(process.argv[2] ?? "../asyncapi.yaml");
const parser = new Parser();
const { document, diagnostics } = await fromFile(parser, path).parse({
  source: pathToFileURL(path).href,
});
// Severity 0 is an error; 1-3 are warnings, information and hints.
const errors = diagnostics.filter((d) => d.severity === 0);
for (const d of diagnostics) {
  const where = d.path?.join(".") || "(document)";
  const kind = ["error", "warning", "info", "hint"][d.severity] ?? d.severity;
  console.log(`${kind}: ${where}: ${d.message} [${d.code}]`);
}
if (!document || errors.length > 0) {
  console.log(`INVALID: ${errors.length} error(s) in ${path}`);
  process.exit(1);
}
console.log(
  `valid AsyncAPI ${document.version()}: ${document.channels().length} channels, ` +
    `${document.operations().length} operations, ${document.messages().length} messages`,
);

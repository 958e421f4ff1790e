// Builds the demo shop into server/shop/dist, which the Go
// package server/shop embeds with //go:embed.
//
// The output must be reproducible (rebuilding from the same package-lock.json
// gives byte-identical files), so: content-hashed file names, no timestamps,
// no source maps with absolute paths, and index.html generated from the
// esbuild metafile in a fixed order.
import * as esbuild from 'esbuild';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeManifest } from './manifest.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const outdir = path.resolve(here, '../../server/shop/dist');
const assetsDir = path.join(outdir, 'assets');

// The trusted documents first: the bundle imports their ids.
await writeManifest();

await rm(outdir, { recursive: true, force: true });
await mkdir(assetsDir, { recursive: true });

const result = await esbuild.build({
  absWorkingDir: here,
  entryPoints: { shop: 'src/main.jsx' },
  outdir: assetsDir,
  entryNames: '[name]-[hash]',
  assetNames: '[name]-[hash]',
  bundle: true,
  minify: true,
  format: 'esm',
  platform: 'browser',
  target: ['es2020', 'chrome100', 'firefox100', 'safari15'],
  jsx: 'automatic',
  define: { 'process.env.NODE_ENV': '"production"' },
  // Keep third-party license texts, in a file next to the bundle.
  legalComments: 'linked',
  charset: 'utf8',
  metafile: true,
  logLevel: 'warning',
});

// Find the entry's JS and its CSS in the metafile.
let js;
let css;
for (const [file, meta] of Object.entries(result.metafile.outputs)) {
  if (meta.entryPoint === 'src/main.jsx') {
    js = file;
    css = meta.cssBundle;
  }
}
if (!js || !css) {
  throw new Error(`could not find bundle outputs in metafile: ${Object.keys(result.metafile.outputs)}`);
}

// Relative URLs, so the page also works if it is ever mounted under a prefix.
const rel = (file) => path.relative(outdir, path.resolve(here, file)).split(path.sep).join('/');
const template = await readFile(path.join(here, 'src/index.html'), 'utf8');
const html = template
  .replace('<!--STYLES-->', `<link rel="stylesheet" href="${rel(css)}" />`)
  .replace('<!--SCRIPTS-->', `<script type="module" src="${rel(js)}"></script>`);
await writeFile(path.join(outdir, 'index.html'), html);

for (const [file, meta] of Object.entries(result.metafile.outputs).sort()) {
  console.log(`${rel(file).padEnd(48)} ${(meta.bytes / 1024).toFixed(1).padStart(8)} KiB`);
}

// The module itself: no dependencies, and the hand-kept .d.ts names exactly what it exports.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { test } from 'node:test';

import * as convsync from '../convsync.js';

const source = (name) => readFileSync(new URL(`../${name}`, import.meta.url), 'utf8');

const LIB = readdirSync(new URL('../lib/', import.meta.url)).filter((name) => name.endsWith('.js'));

/** An import or re-export with its specifier (`import {a} from './x.js';`, `export * from`). */
const FROM = /^(?:import|export)\s+(?:\*(?:\s+as\s+\w+)?|\{[^}]*\}|\w+)\s+from\s+'([^']+)';/gm;

/** The specifiers `name` imports or re-exports from. */
const specifiers = (name) =>
  Array.from(source(name).matchAll(FROM), (m) => m[1]);

test('convsync.js and lib/ import only each other (no dependencies, no build step)', () => {
  assert.ok(LIB.length >= 10, `lib/ holds ${LIB.length} modules`);
  for (const name of ['convsync.js', ...LIB.map((file) => `lib/${file}`)]) {
    const text = source(name);
    assert.doesNotMatch(text, /\brequire\(/, name);
    // No dynamic import either (a JSDoc type's `import('./x.js')` is no import: comments go).
    const code = text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');
    assert.doesNotMatch(code, /\bimport\(/, name);
    const allowed = name === 'convsync.js' ? /^\.\/lib\/\w+\.js$/ : /^\.\/\w+\.js$/;
    for (const specifier of specifiers(name)) {
      assert.match(specifier, allowed, `${name}: ${specifier}`);
    }
    // Every import statement is one the pattern above read (none hides in another shape).
    const statements = text.match(/^\s*(?:import\b|export\s*[{*])/gm) ?? [];
    assert.equal(statements.length, specifiers(name).length, name);
  }
});

test('every lib/ module imports in Node as it is, with no build step', async () => {
  for (const file of LIB) {
    const module = await import(new URL(`../lib/${file}`, import.meta.url).href);
    assert.ok(Object.keys(module).length > 0, `lib/${file} exports nothing`);
  }
});

test('convsync.js re-exports each public name from the lib/ module that defines it', async () => {
  for (const file of LIB) {
    const module = await import(new URL(`../lib/${file}`, import.meta.url).href);
    for (const [name, value] of Object.entries(module)) {
      if (Object.hasOwn(convsync, name)) assert.equal(convsync[name], value, `${file}: ${name}`);
    }
  }
});

test('convsync.d.ts declares every runtime export, and no runtime name that is not exported', () => {
  const declared = new Set(
    Array.from(
      source('convsync.d.ts').matchAll(/^export (?:const|function|class) (\w+)/gm),
      (m) => m[1],
    ),
  );
  assert.deepEqual([...declared].sort(), Object.keys(convsync).sort());
});

test('no import circle among the lib/ modules (each can be read after what it imports)', () => {
  const imports = new Map(
    LIB.map((file) => [file, specifiers(`lib/${file}`).map((s) => s.replace('./', ''))]),
  );
  const done = new Set();
  const visit = (file, path) => {
    assert.ok(!path.includes(file), `import circle: ${[...path, file].join(' -> ')}`);
    if (done.has(file)) return;
    for (const next of imports.get(file)) visit(next, [...path, file]);
    done.add(file);
  };
  for (const file of LIB) visit(file, []);
});

#!/usr/bin/env node
// Writes tests/data/bpe_fixture.json: strings and the GPT-2 token ids that the npm package
// gpt-3-encoder@1.1.4 gives them, for tests/io/test_bpe.cpp.
//
//   npm install --prefix /tmp/bpe-fixture gpt-3-encoder@1.1.4 tiktoken@1.0.22
//   node tools/make_bpe_fixture.js /tmp/bpe-fixture/node_modules > tests/data/bpe_fixture.json
//
// Every string is also encoded with tiktoken (OpenAI's tokenizer, compiled to WebAssembly) as a
// second reference. The two agree except where gpt-3-encoder's regex runs with ECMAScript's \s,
// which counts U+FEFF as white space and U+0085 not; GPT-2's `regex` module and tiktoken use
// Unicode's White_Space (the reverse). For those strings, and only those (the script fails on any
// other disagreement), "ids" holds GPT-2's ids and "package_ids" what gpt-3-encoder gives.
'use strict';

const path = require('path');
const modules = process.argv[2];
if (!modules) {
  process.stderr.write('usage: node tools/make_bpe_fixture.js NODE_MODULES_DIR\n');
  process.exit(2);
}
const gpt3 = require(path.join(modules, 'gpt-3-encoder'));
const gpt3Version = require(path.join(modules, 'gpt-3-encoder', 'package.json')).version;
const tiktoken = require(path.join(modules, 'tiktoken'));
const tiktokenVersion = require(path.join(modules, 'tiktoken', 'package.json')).version;
const gpt2 = tiktoken.get_encoding('gpt2');

// Hand-picked cases, by what they exercise.
const cases = [
  // Plain English, capitals, sentence punctuation.
  'Hello world', 'Hello, world!', 'The quick brown fox jumps over the lazy dog.',
  'GPT-2 is a language model.', 'hello', ' hello', '  hello', 'Hello World HELLO wORLD',
  // Contractions, lower and capitalized, and apostrophes that are not contractions.
  "it's", "don't", "we're", "they've", "I'm", "you'll", "he'd", "IT'S", "DON'T", "We'Re",
  "I'M", "You'LL", "He'D", "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D",
  "rock 'n' roll", "'tis", "''s", "students' books", "O'Neill's", "'", "''", "' s", "x's's",
  "'sup 'til 'm8 'dx",
  // Numbers: runs of digits, with signs, decimals, separators, and other scripts' digits.
  '0', '1234567890', '3.14159', '-42', '+7', '1,000,000', '1e10', 'abc123def', '2023-10-05',
  ' 12 345', '١٢٣ ٤٥٦', '一二三', '½ ⅓ ¾', 'Ⅻ', '²³',
  // Punctuation runs and symbols.
  '!!!', '???!!!', '...', '—', '“quoted”', '«guillemets»', '(parens) [brackets] {braces}',
  '@#$%^&*', 'a+b=c', 'path/to/file.txt', 'https://example.com/a?b=c&d=e', '<html><body>',
  '``Brown quotes\'\'', 'e-mail', '--flag', ' !', ' ?!', '#hashtag', '$100.00',
  // White space: runs of spaces, tabs, newlines, trailing and leading spaces, mixtures.
  ' ', '  ', '   ', 'a b', 'a  b', 'a   b', 'a\tb', 'a\t\tb', 'a\nb', 'a\n\nb', 'a\r\nb',
  'trailing ', 'trailing   ', ' leading', '   leading', '\n', '\n\n\n', '\t', 'a \tb',
  'a\t b', 'a \n b', 'line1\nline2\n', '  \n  x', 'x\n ', 'end.\n\n', '\u00a0', 'a\u00a0b',
  'a \u00a0b', 'a\u3000b', 'a\u2003b', 'x\u2028y', '\u000b\u000c', ' \t\n\r ',
  'word   \n   word', 'a' + ' '.repeat(40) + 'b',
  // Accents: precomposed and with combining marks.
  'café', 'naïve', 'Ångström', 'façade', 'résumé', 'Zürich', 'São Paulo', 'Łódź', 'Dvořák',
  'cafe\u0301', 'n\u0303', 'a\u0300\u0301\u0302', 'e\u0301\u0301 x', '\u0301', ' \u0301',
  // Other scripts.
  'Привет, мир!', 'Γειά σου Κόσμε', 'שלום עולם', 'مرحبا بالعالم', 'नमस्ते दुनिया', 'สวัสดีชาวโลก',
  '你好，世界', '日本語のテキストです。', '한국어 텍스트', 'ქართული', 'Հայերեն',
  // Emoji: single, sequences with joiners and modifiers, flags, keycaps.
  '😀', 'hi 😀', '😀😀😀', '👍🏽', '👨‍👩‍👧‍👦', '🇺🇸🇫🇷', '1️⃣', '❤️', 'emoji 🎉 party 🎊!',
  // Letters and numbers beyond the BMP.
  '𝐀𝐁𝐂', '𝟙𝟚𝟛', '𐍈𐌰𐌹', 'a𝐀b', '𠀀𠀁',
  // <|endoftext|>: ordinary text for the package, not the special token.
  '<|endoftext|>', 'Hello<|endoftext|>World', 'a <|endoftext|> b', '<|endoftext|><|endoftext|>',
  '<|endoftext', 'endoftext|>',
  // Where ECMAScript's \s and Unicode's White_Space differ.
  'a \u0085b', 'x\u0085 \u0085y', '  \u0085x', 'a \ufeffb', '\ufeff\ufeff', ' \ufeffx',
  'a\u0085\n', '\ufeffBOM text',
  // Long words and repeated characters.
  'supercalifragilisticexpialidocious', 'antidisestablishmentarianism',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'abababababababababab', '================',
  '____________', '!!!!!!!!!!!!!!!!!!!!', '000000000000000000',
  // Mixed.
  'The year 1984 was 35 years ago; it\'s now 2019.', 'C++17 & Python3.8 (beta)',
  'def f(x):\n    return x ** 2\n', '{"key": [1, 2, 3]}', 'mixed 中文 and English 123',
  '',
];

// Random strings built from fragments of every kind above, from a fixed seed (mulberry32).
function mulberry32(seed) {
  return function() {
    seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const fragments = [
  'the', 'The', ' of', 'and', 'Strata', 'token', 's', "'s", "'t", "'re", "'ve", "'m", "'ll",
  "'d", "'S", "'", ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', '0', '42', '3.14', '1,000',
  '.', ',', '!', '?', '...', '-', '—', '(', ')', '"', '``', "''", '$', '%', 'é', 'ü', 'ñ',
  'e\u0301', '\u0301', '中', '文字', 'ひらがな', 'カタカナ', '한', 'я', 'Ω', 'ß', '😀', '🎉',
  '👍🏽', '𝐀', '٣', '½', '\u00a0', '\u3000', '<|endoftext|>', 'x', 'Q', 'zz',
];
const random = mulberry32(20240520);
for (let i = 0; i < 300; ++i) {
  const count = 1 + Math.floor(random() * 12);
  let s = '';
  for (let j = 0; j < count; ++j) s += fragments[Math.floor(random() * fragments.length)];
  cases.push(s);
}

const out = [];
let differing = 0;
for (const text of cases) {
  const ids = gpt3.encode(text);
  const reference = Array.from(gpt2.encode_ordinary(text));
  // (Bytes compared through tiktoken's decode: gpt-3-encoder's TextDecoder drops a leading BOM.)
  if (Buffer.from(gpt2.decode(Uint32Array.from(ids))).toString('utf8') !== text) {
    throw new Error(`the ids of ${JSON.stringify(text)} do not decode to it`);
  }
  if (ids.join() === reference.join()) {
    out.push({text, ids});
    continue;
  }
  if (!/[\u0085\ufeff]/.test(text)) {
    throw new Error(`gpt-3-encoder and tiktoken disagree on ${JSON.stringify(text)}`);
  }
  ++differing;
  out.push({text, ids: reference, package_ids: ids});
}
gpt2.free();

const header = {
  generator: 'tools/make_bpe_fixture.js',
  package: 'gpt-3-encoder@' + gpt3Version,
  reference: 'tiktoken@' + tiktokenVersion + ' (gpt2)',
  node: process.versions.node,
  unicode: process.versions.unicode,
  note: 'ids: GPT-2 token ids. package_ids (where present): what gpt-3-encoder gives instead, ' +
      'because its \\s is ECMAScript\'s (U+FEFF in, U+0085 out) rather than Unicode White_Space',
  cases: out.length,
  package_differs: differing,
};
const lines = ['{'];
for (const [k, v] of Object.entries(header)) lines.push(`  ${JSON.stringify(k)}: ${JSON.stringify(v)},`);
lines.push('  "strings": [');
out.forEach((c, i) => lines.push('    ' + JSON.stringify(c) + (i + 1 < out.length ? ',' : '')));
lines.push('  ]');
lines.push('}');
process.stdout.write(lines.join('\n') + '\n');

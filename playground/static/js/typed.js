/*
 * What a person types, as Slack's client stores it in the message's text: a typed @channel,
 * @here or @everyone becomes `<!channel>` …, a pasted web address `<https://…>`, and any other
 * `<`, `>` or `&` is escaped (`&lt;` `&gt;` `&amp;`), so it shows as typed. Markup a person writes
 * on purpose (`<!channel>`, `<@U…>`, `<#C…|name>`, `<https://…|label>`) is kept as written: the
 * message then holds what a person's message holds in Slack, and the page renders it as Slack
 * renders a person's text. Inside `code` and ```blocks``` nothing is converted, only escaped.
 */

import { isSafeUrl } from './mrkdwn.js';

/** The `<…>` tokens a person's message may hold, by what stands before any `|label`. */
const PERSON_TOKEN = /^(?:@[UW][A-Z0-9]+|#[CGD][A-Z0-9]+|!(?:here|channel|everyone)|!subteam\^[A-Z0-9]+|!date\^\d+\^[^|]*)$/;

/** A bare web address (trailing punctuation left out, as Slack does), or a typed special mention. */
const BARE = /https?:\/\/[^\s<>]*[^\s<>.,;:!?)'"\]]|(?<![\p{L}\p{N}_@.])@(?:here|channel|everyone)(?![\p{L}\p{N}_-])/gu;

/** `&`, `<` and `>` as Slack's entities: they show as typed and never start a token. */
function escaped(text) {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function isPersonToken(inner) {
  const bar = inner.indexOf('|');
  const target = bar < 0 ? inner : inner.slice(0, bar);
  return PERSON_TOKEN.test(target) || (isSafeUrl(target) && !/\s/.test(target));
}

/** Plain typed text: web addresses and special mentions become tokens, the rest is escaped. */
function converted(text) {
  let out = '';
  let pos = 0;
  for (const m of text.matchAll(BARE)) {
    out += escaped(text.slice(pos, m.index));
    out += m[0][0] === '@' ? `<!${m[0].slice(1)}>` : `<${escaped(m[0])}>`;
    pos = m.index + m[0].length;
  }
  return out + escaped(text.slice(pos));
}

/** Text outside code: the tokens a person wrote are kept, everything between them converted. */
function outsideCode(text) {
  return text.split(/(<[^<>\n]*>)/).map((part, i) =>
    i % 2 && isPersonToken(part.slice(1, -1)) ? part : converted(part)).join('');
}

/** What a person typed in a message box -> the message's text as Slack stores it. */
export function storedText(typed) {
  return String(typed).split(/(```[\s\S]*?```|`[^`\n]*`)/).map((part, i) =>
    i % 2 ? escaped(part) : outsideCode(part)).join('');
}

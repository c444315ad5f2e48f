//! One document to token ids plus, where only part of it is trained on, a loss mask.
//!
//! Every document ends with the end-of-document token (added unless the tokenizer's
//! post-processor already ended it with one). Text is encoded like `tokenizer(text)` in
//! `transformers` (special tokens on: BOS for Llama-style tokenizers); a chat is rendered by
//! its template, which writes its own special tokens, and encoded like
//! `apply_chat_template(tokenize=True)` (special tokens off). A token is trained on when the
//! text it covers overlaps the completion or an assistant turn; the end of a prompt/completion
//! record (the end-of-document token, whether the post-processor or shardrun wrote it) is
//! trained on (the model learns to stop), the token appended to a chat is not (the template's
//! own end-of-turn token already is). A chat whose template ends it with the end-of-document
//! token and then only whitespace gets none.

use crate::chat::ChatTemplate;
use crate::documents::{Body, Document};
use crate::tokenizer::TextTokenizer;
use std::ops::Range;

/// Token ids of one document; `mask[i]` is 1 where token `i` is a training target. An empty
/// mask means every token is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    pub tokens: Vec<u32>,
    pub mask: Vec<u8>,
    /// A prompt/completion record whose prompt ends inside a token that also holds the
    /// completion's first characters: that token's text. Trained in the loss, it teaches the
    /// completion after a prompt tokenized as it never is alone (`"\n"` + `"    return"`
    /// encoded as `"\n   "` + `" return"`).
    pub merged_boundary: Option<String>,
    /// A chat: whether the end-of-document token is a training target in it (the template
    /// ends an assistant turn with it).
    pub chat_trains_eos: Option<bool>,
    /// A chat: the last token it trains that is not white space, what its trained turns end
    /// with (a newline the template writes after the end-of-turn token is not the end).
    pub turn_end: Option<u32>,
}

pub struct Encoder<'a> {
    pub tokenizer: &'a TextTokenizer,
    pub chat: Option<&'a ChatTemplate>,
}

impl Encoder<'_> {
    pub fn encode(&self, document: &Document) -> Result<Encoded, String> {
        let eos = self.tokenizer.eos.id;
        match &document.body {
            Body::Text(text) => {
                let mut tokens = self.tokenizer.encode(text, true, false)?.ids;
                end_with(&mut tokens, None, eos, 1);
                Ok(Encoded {
                    tokens,
                    mask: Vec::new(),
                    merged_boundary: None,
                    chat_trains_eos: None,
                    turn_end: None,
                })
            }
            Body::PromptCompletion { prompt, completion } => {
                let text = format!("{prompt}{completion}");
                let encoding = self.tokenizer.encode(&text, true, true)?;
                let completion = prompt.len()..text.len();
                let mut mask = mask_of(&encoding.offsets, std::slice::from_ref(&completion));
                let merged_boundary = merged_boundary(&encoding.offsets, &text, completion.start);
                // What the post-processor appends after the text (`</s>` of a Llama 2 folder
                // saved with `add_eos_token`) holds no text, so the overlap rule leaves it
                // out; it ends the completion: trained, like the end-of-document token.
                let text_end = encoding
                    .offsets
                    .iter()
                    .rposition(|&(start, end)| end > start)
                    .map_or(0, |last| last + 1);
                mask[text_end..].fill(1);
                let mut tokens = encoding.ids;
                end_with(&mut tokens, Some(&mut mask), eos, 1);
                Ok(Encoded {
                    tokens,
                    mask,
                    merged_boundary,
                    chat_trains_eos: None,
                    turn_end: None,
                })
            }
            Body::Chat {
                messages,
                tools,
                prompt_len,
            } => {
                let template = self
                    .chat
                    .ok_or_else(|| "chat records need a chat template".to_string())?;
                let (text, spans) = match prompt_len {
                    Some(n) => {
                        template.render_completion_for_training(messages, *n, tools.as_ref())?
                    }
                    None => template.render_for_training(messages, tools.as_ref())?,
                };
                let encoding = self.tokenizer.encode(&text, false, true)?;
                let mut mask = mask_of(&encoding.offsets, &spans);
                // A completion's first characters in the prompt's last token (a generation
                // prompt ending in a space): as for text prompt/completion records.
                let merged_boundary = match (prompt_len, spans.first()) {
                    (Some(_), Some(completion)) => {
                        merged_boundary(&encoding.offsets, &text, completion.start)
                    }
                    _ => None,
                };
                let turn_end = mask
                    .iter()
                    .zip(&encoding.offsets)
                    .zip(&encoding.ids)
                    .rev()
                    .find(|((&m, &(start, end)), _)| {
                        m == 1 && text.get(start..end).is_none_or(|t| !t.trim().is_empty())
                    })
                    .map(|(_, &id)| id);
                // A template that ends its last turn with the end-of-document token and then
                // a newline (ChatML with `<|im_end|>` as eos) has ended the chat already;
                // another eos after the newline is a token the model never sees in use.
                let ended = ends_with_eos_then_blank(&encoding.ids, &encoding.offsets, &text, eos);
                let mut tokens = encoding.ids;
                if !ended {
                    end_with(&mut tokens, Some(&mut mask), eos, 0);
                }
                let trains_eos = tokens.iter().zip(&mask).any(|(&t, &m)| t == eos && m == 1);
                Ok(Encoded {
                    tokens,
                    mask,
                    merged_boundary,
                    chat_trains_eos: Some(trains_eos),
                    turn_end,
                })
            }
        }
    }
}

/// The text of the token that holds both the character before `at` and the one at it: a
/// prompt's last characters and its completion's first, encoded as one token.
fn merged_boundary(offsets: &[(usize, usize)], text: &str, at: usize) -> Option<String> {
    offsets
        .iter()
        .find(|&&(start, end)| start < at && at < end)
        .and_then(|&(start, end)| text.get(start..end))
        .map(str::to_string)
}

/// 1 for every token whose text overlaps one of `spans` (as `transformers` marks a token
/// holding any character of a generation span).
pub fn mask_of(offsets: &[(usize, usize)], spans: &[Range<usize>]) -> Vec<u8> {
    offsets
        .iter()
        .map(|&(start, end)| {
            let hit = end > start && spans.iter().any(|s| start < s.end && s.start < end);
            u8::from(hit)
        })
        .collect()
}

/// Whether the last `eos` in `ids` is followed only by tokens of whitespace in `text`.
fn ends_with_eos_then_blank(ids: &[u32], offsets: &[(usize, usize)], text: &str, eos: u32) -> bool {
    ids.iter().rposition(|&id| id == eos).is_some_and(|last| {
        offsets[last + 1..]
            .iter()
            .all(|&(start, end)| text.get(start..end).is_some_and(|t| t.trim().is_empty()))
    })
}

/// Appends `eos` unless the tokens already end with it (the mask gets `eos_mask` for it).
fn end_with(tokens: &mut Vec<u32>, mask: Option<&mut Vec<u8>>, eos: u32, eos_mask: u8) {
    if tokens.last() != Some(&eos) {
        tokens.push(eos);
        if let Some(mask) = mask {
            mask.push(eos_mask);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardrun_protocol::config::TokenizerConfig;

    fn doc(body: Body) -> Document {
        Document {
            body,
            file: 0,
            line: 1,
        }
    }

    #[test]
    fn completion_and_its_end_are_the_targets() {
        let bytes = TextTokenizer::load(&TokenizerConfig::Bytes).unwrap();
        let encoder = Encoder {
            tokenizer: &bytes,
            chat: None,
        };
        let e = encoder
            .encode(&doc(Body::PromptCompletion {
                prompt: "Q?".into(),
                completion: "A".into(),
            }))
            .unwrap();
        assert_eq!(e.tokens, [b'Q' as u32, b'?' as u32, b'A' as u32, 256]);
        assert_eq!(e.mask, [0, 0, 1, 1]);
        let e = encoder.encode(&doc(Body::Text("hi".into()))).unwrap();
        assert_eq!((e.tokens, e.mask), (vec![104, 105, 256], vec![]));
    }

    #[test]
    fn overlap_rule() {
        let offsets = [(0, 2), (2, 5), (5, 6), (0, 0)];
        assert_eq!(mask_of(&offsets, &[3..6, 9..9]), [0, 1, 1, 0]);
        assert_eq!(mask_of(&offsets, &[]), [0, 0, 0, 0]);
    }
}

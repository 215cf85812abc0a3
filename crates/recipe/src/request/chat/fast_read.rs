//! The one-pass fast path that reads a Chat Completions request object into its wire types.

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer, SeqDeserializer};
use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::wire::{
    ChatCompletionRequest, ChatCompletionRequestContentBlock, ChatCompletionRequestMessage,
    ChatCompletionRequestToolCall, Content,
};
use crate::request::body::Key;

/// Reads a request object in one pass on the fast path (see
/// [`read_fast`](crate::request::body::read_fast)): takes `max_completion_tokens` out before the
/// derived visitor sees the fields (so the limit needs no second parse), and reads `messages`
/// with [`FlatMessage`] instead of the internally tagged enum, which buffers every message before
/// reading it. Anything unusual (a repeated limit, a message the flat reader cannot place) is an
/// error here, which sends the body down the slow path and its official messages.
pub(super) struct FastRequest;

impl<'de> Visitor<'de> for FastRequest {
    type Value = (Box<ChatCompletionRequest>, Option<Value>);

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct ChatCompletionRequest")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Self::Value, A::Error> {
        let mut fields = FastFields {
            map,
            limit: None,
            messages: None,
            messages_next: false,
        };
        let mut request =
            ChatCompletionRequest::deserialize(MapAccessDeserializer::new(&mut fields))?;
        // The derived visitor got an empty list in place of the messages read here.
        if let Some(messages) = fields.messages {
            request.messages = messages;
        }
        Ok((Box::new(request), fields.limit.flatten()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Self::Value, A::Error> {
        let request = ChatCompletionRequest::deserialize(SeqAccessDeserializer::new(seq))?;
        Ok((Box::new(request), None))
    }
}

/// The entries of a request object as [`FastRequest`] hands them to the derived visitor.
struct FastFields<A> {
    map: A,
    limit: Option<Option<Value>>,
    messages: Option<Vec<ChatCompletionRequestMessage>>,
    /// The key just handed on was `messages`: its value is read here.
    messages_next: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for &mut FastFields<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> std::result::Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.map.next_key::<Key<'de>>()? {
            match key.as_str() {
                "max_completion_tokens" => {
                    if self.limit.is_some() {
                        return Err(A::Error::custom("duplicate field `max_completion_tokens`"));
                    }
                    self.limit = Some(self.map.next_value()?);
                }
                name => {
                    self.messages_next = name == "messages";
                    return key.feed(seed).map(Some);
                }
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> std::result::Result<V::Value, A::Error> {
        if !std::mem::take(&mut self.messages_next) {
            return self.map.next_value_seed(seed);
        }
        if self.messages.is_some() {
            return Err(A::Error::custom("duplicate field `messages`"));
        }
        let FlatMessages(messages) = self.map.next_value()?;
        self.messages = Some(messages);
        seed.deserialize(SeqDeserializer::new(std::iter::empty::<()>()))
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// A message list read with [`FlatMessage`].
struct FlatMessages(Vec<ChatCompletionRequestMessage>);

impl<'de> Deserialize<'de> for FlatMessages {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FlatMessages;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of messages")
            }
            fn visit_seq<S: SeqAccess<'de>>(
                self,
                mut seq: S,
            ) -> std::result::Result<FlatMessages, S::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(FlatMessage(m)) = seq.next_element()? {
                    out.push(m);
                }
                Ok(FlatMessages(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One message read as an object holding every field any role has, then placed in its variant.
/// It accepts a subset of what the tagged enum accepts, with the same result: fields another role
/// would ignore must still have their type here, and a repeated key is an error (the tagged enum
/// reads the content through a value, where the last one wins).
struct FlatMessage(ChatCompletionRequestMessage);

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum FlatRole {
    System,
    User,
    Assistant,
    Tool,
    LatestReminder,
}

/// `content`: a string or a list of blocks, read directly (the tagged enum goes through a value).
enum FlatContent {
    Text(String),
    Parts(Vec<ChatCompletionRequestContentBlock>),
}

impl<'de> Deserialize<'de> for FlatContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FlatContent;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list")
            }
            fn visit_str<E: serde::de::Error>(
                self,
                s: &str,
            ) -> std::result::Result<FlatContent, E> {
                Ok(FlatContent::Text(s.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(
                self,
                s: String,
            ) -> std::result::Result<FlatContent, E> {
                Ok(FlatContent::Text(s))
            }
            fn visit_seq<S: SeqAccess<'de>>(
                self,
                seq: S,
            ) -> std::result::Result<FlatContent, S::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(FlatContent::Parts)
            }
        }
        d.deserialize_any(V)
    }
}

impl From<FlatContent> for Content {
    fn from(c: FlatContent) -> Self {
        match c {
            FlatContent::Text(s) => Content::Text(s),
            FlatContent::Parts(p) => Content::Parts(p),
        }
    }
}

impl<'de> Deserialize<'de> for FlatMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FlatMessage;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<FlatMessage, A::Error> {
                fn put<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
                    map: &mut A,
                    slot: &mut Option<T>,
                ) -> std::result::Result<(), A::Error> {
                    if slot.is_some() {
                        return Err(A::Error::custom("duplicate field"));
                    }
                    *slot = Some(map.next_value()?);
                    Ok(())
                }
                // Outer `Some`: the key was seen (a second one is an error).
                let mut role: Option<FlatRole> = None;
                let mut content: Option<Option<FlatContent>> = None;
                let mut name: Option<Option<String>> = None;
                let mut reasoning_content: Option<Option<String>> = None;
                let mut tool_calls: Option<Option<Vec<ChatCompletionRequestToolCall>>> = None;
                let mut prefix: Option<Option<bool>> = None;
                let mut tool_call_id: Option<Option<String>> = None;
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    match key.as_str() {
                        "role" => put(&mut map, &mut role)?,
                        "content" => put(&mut map, &mut content)?,
                        "name" => put(&mut map, &mut name)?,
                        "reasoning_content" => put(&mut map, &mut reasoning_content)?,
                        "tool_calls" => put(&mut map, &mut tool_calls)?,
                        "prefix" => put(&mut map, &mut prefix)?,
                        "tool_call_id" => put(&mut map, &mut tool_call_id)?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let missing = || A::Error::custom("not a simple message");
                let content = content.flatten();
                let name = name.flatten();
                let message = match role.ok_or_else(missing)? {
                    FlatRole::System => ChatCompletionRequestMessage::System {
                        content: content.ok_or_else(missing)?.into(),
                        name,
                    },
                    FlatRole::User => ChatCompletionRequestMessage::User {
                        content: content.ok_or_else(missing)?.into(),
                        name,
                    },
                    FlatRole::Assistant => ChatCompletionRequestMessage::Assistant {
                        content: content.map(Content::from),
                        name,
                        reasoning_content: reasoning_content.flatten(),
                        tool_calls: tool_calls.flatten(),
                        prefix: prefix.flatten(),
                    },
                    FlatRole::Tool => ChatCompletionRequestMessage::Tool {
                        content: content.ok_or_else(missing)?.into(),
                        tool_call_id: tool_call_id.flatten().ok_or_else(missing)?,
                    },
                    FlatRole::LatestReminder => match content {
                        Some(FlatContent::Text(content)) => {
                            ChatCompletionRequestMessage::LatestReminder { content }
                        }
                        _ => return Err(missing()),
                    },
                };
                Ok(FlatMessage(message))
            }
        }
        d.deserialize_map(V)
    }
}

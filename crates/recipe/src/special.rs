//! Special tokens and their spellings. The spellings can be overridden (`SpecialTokens`), and
//! both the renderer and the stream parser follow the override.

use std::borrow::Cow;
use std::sync::Arc;

/// A kind of special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpecialToken {
    Bos,
    Eos,
    ThinkingStart,
    ThinkingEnd,
    System,
    User,
    Assistant,
    LatestReminder,
    Dsml,
    Image,
    Ref,
    RefEnd,
    Box,
    BoxEnd,
    Point,
    PointEnd,
    Polygon,
    PolygonEnd,
}

impl SpecialToken {
    pub const ALL: [SpecialToken; 18] = [
        SpecialToken::Bos,
        SpecialToken::Eos,
        SpecialToken::ThinkingStart,
        SpecialToken::ThinkingEnd,
        SpecialToken::System,
        SpecialToken::User,
        SpecialToken::Assistant,
        SpecialToken::LatestReminder,
        SpecialToken::Dsml,
        SpecialToken::Image,
        SpecialToken::Ref,
        SpecialToken::RefEnd,
        SpecialToken::Box,
        SpecialToken::BoxEnd,
        SpecialToken::Point,
        SpecialToken::PointEnd,
        SpecialToken::Polygon,
        SpecialToken::PolygonEnd,
    ];

    /// The spelling DeepSeek's tokenizer uses.
    pub fn default_str(self) -> &'static str {
        match self {
            SpecialToken::Bos => "<｜begin▁of▁sentence｜>",
            SpecialToken::Eos => "<｜end▁of▁sentence｜>",
            SpecialToken::ThinkingStart => "<think>",
            SpecialToken::ThinkingEnd => "</think>",
            SpecialToken::System => "<｜System｜>",
            SpecialToken::User => "<｜User｜>",
            SpecialToken::Assistant => "<｜Assistant｜>",
            SpecialToken::LatestReminder => "<｜latest_reminder｜>",
            SpecialToken::Dsml => "｜DSML｜",
            SpecialToken::Image => "<｜image｜>",
            SpecialToken::Ref => "<｜ref｜>",
            SpecialToken::RefEnd => "<｜/ref｜>",
            SpecialToken::Box => "<｜box｜>",
            SpecialToken::BoxEnd => "<｜/box｜>",
            SpecialToken::Point => "<｜point｜>",
            SpecialToken::PointEnd => "<｜/point｜>",
            SpecialToken::Polygon => "<｜polygon｜>",
            SpecialToken::PolygonEnd => "<｜/polygon｜>",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The spelling of every special token. The default mapping is `None`, so copying it into each
/// converted request's parsing options costs a pointer copy; overridden mappings are shared.
#[derive(Clone, Debug, Default)]
pub struct SpecialTokens {
    overrides: Option<Arc<[Cow<'static, str>; 18]>>,
}

impl PartialEq for SpecialTokens {
    fn eq(&self, other: &Self) -> bool {
        SpecialToken::ALL
            .iter()
            .all(|&t| self.token(t) == other.token(t))
    }
}

impl Eq for SpecialTokens {}

impl SpecialTokens {
    pub fn token(&self, token: SpecialToken) -> &str {
        match &self.overrides {
            None => token.default_str(),
            Some(spellings) => &spellings[token.index()],
        }
    }

    /// The same mapping with `token` spelled `spelling`.
    pub fn with(mut self, token: SpecialToken, spelling: impl Into<String>) -> Self {
        let spellings = self.overrides.get_or_insert_with(|| {
            Arc::new(SpecialToken::ALL.map(|t| Cow::Borrowed(t.default_str())))
        });
        Arc::make_mut(spellings)[token.index()] = Cow::Owned(spelling.into());
        self
    }
}

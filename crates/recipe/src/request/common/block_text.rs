//! Message text assembled from content blocks.

/// Message text assembled from content blocks: blocks joined by blank lines, each image as one
/// image token whose span is recorded.
#[derive(Default)]
pub(crate) struct BlockText {
    text: String,
    blocks: usize,
    placeholders: Vec<(usize, usize)>,
}

impl BlockText {
    fn separate(&mut self) {
        if self.blocks > 0 {
            self.text.push_str("\n\n");
        }
        self.blocks += 1;
    }

    pub fn push_text(&mut self, text: &str) {
        self.separate();
        self.text.push_str(text);
    }

    pub fn push_image(&mut self, image_token: &str) {
        self.separate();
        let start = self.text.len();
        self.text.push_str(image_token);
        self.placeholders.push((start, self.text.len()));
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// (text, placeholder spans)
    pub fn finish(self) -> (String, Vec<(usize, usize)>) {
        (self.text, self.placeholders)
    }
}

//! The small XML that NCCL's topology files are written in: elements with
//! attributes in double quotes, nested, no text content; comments and an
//! `<?xml ...?>` declaration are skipped. Read and written here without an
//! XML crate: the format is NCCL's own subset (`src/graph/xml.cc` reads it
//! token by token), and a general parser would accept files NCCL refuses.
//!
//! Attributes keep their order, so that a file read and written back is
//! the same file.

use std::fmt::Write as _;

/// One element.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Element {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub children: Vec<Element>,
}

impl Element {
    pub fn new(name: &str) -> Element {
        Element {
            name: name.to_string(),
            ..Element::default()
        }
    }

    /// The value of attribute `key`.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets `key`, replacing its value where it is there.
    pub fn set(&mut self, key: &str, value: impl ToString) -> &mut Element {
        let value = value.to_string();
        match self.attrs.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.attrs.push((key.to_string(), value)),
        }
        self
    }

    /// Sets `key` only where it is not there: what a file says wins over
    /// what detection finds, as NCCL's `xmlInitAttr`.
    pub fn init(&mut self, key: &str, value: impl ToString) -> &mut Element {
        if self.attr(key).is_none() {
            self.set(key, value);
        }
        self
    }

    /// Adds a child and returns it.
    pub fn push(&mut self, child: Element) -> &mut Element {
        self.children.push(child);
        self.children.last_mut().expect("just pushed")
    }

    /// Children named `name`.
    pub fn subs<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// Writes the element as NCCL's `ncclTopoDumpXmlToFile` does: two
    /// spaces per level, `/>` for an element without children.
    pub fn write(&self) -> String {
        let mut s = String::new();
        self.write_at(0, &mut s);
        s
    }

    fn write_at(&self, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        let _ = write!(out, "{pad}<{}", self.name);
        for (k, v) in &self.attrs {
            let _ = write!(out, " {k}=\"{}\"", escape(v));
        }
        if self.children.is_empty() {
            out.push_str("/>\n");
        } else {
            out.push_str(">\n");
            for c in &self.children {
                c.write_at(indent + 2, out);
            }
            let _ = writeln!(out, "{pad}</{}>", self.name);
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn unescape(v: &str) -> String {
    v.replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Why a file is not a topology: what was met, and at which line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {what}")]
pub struct XmlError {
    pub line: usize,
    pub what: String,
}

/// Parses a document with one top element (NCCL's `<system>`).
pub fn parse(text: &str) -> Result<Element, XmlError> {
    let mut p = Parser { s: text, at: 0 };
    p.skip_misc()?;
    let top = p.element()?;
    p.skip_misc()?;
    if p.at < p.s.len() {
        return Err(p.err("text after the top element"));
    }
    Ok(top)
}

struct Parser<'a> {
    s: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, what: impl Into<String>) -> XmlError {
        XmlError {
            line: self.s[..self.at.min(self.s.len())].matches('\n').count() + 1,
            what: what.into(),
        }
    }

    fn rest(&self) -> &'a str {
        &self.s[self.at..]
    }

    fn skip_ws(&mut self) {
        let r = self.rest();
        self.at += r.len() - r.trim_start().len();
    }

    /// White space, comments and declarations (`<?...?>`, `<!...>`).
    fn skip_misc(&mut self) -> Result<(), XmlError> {
        loop {
            self.skip_ws();
            let (open, close) = if self.rest().starts_with("<!--") {
                ("<!--", "-->")
            } else if self.rest().starts_with("<?") {
                ("<?", "?>")
            } else if self.rest().starts_with("<!") {
                ("<!", ">")
            } else {
                return Ok(());
            };
            match self.rest()[open.len()..].find(close) {
                Some(i) => self.at += open.len() + i + close.len(),
                None => return Err(self.err(format!("{open} without {close}"))),
            }
        }
    }

    fn name(&mut self) -> Result<String, XmlError> {
        let r = self.rest();
        let n = r
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
            .unwrap_or(r.len());
        if n == 0 {
            return Err(self.err(format!(
                "expected a name, found {:?}",
                r.chars().next().unwrap_or(' ')
            )));
        }
        self.at += n;
        Ok(r[..n].to_string())
    }

    fn expect(&mut self, tok: &str) -> Result<(), XmlError> {
        if self.rest().starts_with(tok) {
            self.at += tok.len();
            Ok(())
        } else {
            Err(self.err(format!("expected {tok:?}")))
        }
    }

    fn element(&mut self) -> Result<Element, XmlError> {
        self.expect("<")?;
        let mut e = Element::new(&self.name()?);
        loop {
            self.skip_ws();
            if self.rest().starts_with("/>") {
                self.at += 2;
                return Ok(e);
            }
            if self.rest().starts_with('>') {
                self.at += 1;
                break;
            }
            let key = self.name()?;
            self.skip_ws();
            self.expect("=")?;
            self.skip_ws();
            let quote = match self.rest().chars().next() {
                Some(q @ ('"' | '\'')) => q,
                _ => return Err(self.err(format!("attribute {key} has no quoted value"))),
            };
            self.at += 1;
            let Some(end) = self.rest().find(quote) else {
                return Err(self.err(format!("attribute {key}'s value is not closed")));
            };
            let value = unescape(&self.rest()[..end]);
            self.at += end + 1;
            if e.attr(&key).is_some() {
                return Err(self.err(format!("attribute {key} twice in <{}>", e.name)));
            }
            e.attrs.push((key, value));
        }
        loop {
            self.skip_misc()?;
            if self.rest().starts_with("</") {
                self.at += 2;
                let end = self.name()?;
                if end != e.name {
                    return Err(self.err(format!("</{end}> closes <{}>", e.name)));
                }
                self.skip_ws();
                self.expect(">")?;
                return Ok(e);
            }
            if self.rest().is_empty() {
                return Err(self.err(format!("<{}> is not closed", e.name)));
            }
            if !self.rest().starts_with('<') {
                return Err(self.err(format!("text inside <{}>", e.name)));
            }
            e.children.push(self.element()?);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_it_writes() {
        let mut sys = Element::new("system");
        sys.set("version", 1);
        let cpu = sys.push(Element::new("cpu"));
        cpu.set("numaid", 0).set("affinity", "0000ffff");
        let pci = cpu.push(Element::new("pci"));
        pci.set("busid", "0000:1b:00.0")
            .set("link_speed", "32.0 GT/s PCIe");
        pci.push(Element::new("gpu")).set("dev", 0).set("sm", 90);
        let text = sys.write();
        assert_eq!(
            text,
            "<system version=\"1\">\n  <cpu numaid=\"0\" affinity=\"0000ffff\">\n    \
             <pci busid=\"0000:1b:00.0\" link_speed=\"32.0 GT/s PCIe\">\n      \
             <gpu dev=\"0\" sm=\"90\"/>\n    </pci>\n  </cpu>\n</system>\n"
        );
        assert_eq!(parse(&text).unwrap(), sys);
    }

    #[test]
    fn comments_declarations_and_quotes() {
        let t = "<?xml version=\"1.0\"?>\n<!-- a node -->\n<system version='1' name=\"a&amp;b\">\
                 <!-- inside --><cpu numaid=\"1\"></cpu ></system>\n";
        let e = parse(t).unwrap();
        assert_eq!(e.attr("name"), Some("a&b"));
        assert_eq!(e.subs("cpu").count(), 1);
        assert_eq!(parse(&e.write()).unwrap(), e);
    }

    #[test]
    fn bad_files_say_where() {
        for (t, line, what) in [
            ("<system>\n<cpu>\n</system>", 3, "closes <cpu>"),
            ("<system a=1/>", 1, "quoted"),
            ("<system>\n  text\n</system>", 2, "text inside"),
            ("<system/><other/>", 1, "after the top"),
            ("<system a=\"1\" a=\"2\"/>", 1, "twice"),
            ("<system>\n<cpu/>", 2, "not closed"),
        ] {
            let e = parse(t).unwrap_err();
            assert_eq!(e.line, line, "{t}: {e}");
            assert!(e.what.contains(what), "{t}: {e}");
        }
    }
}

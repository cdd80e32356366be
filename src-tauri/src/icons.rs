//! The tray's icons, drawn in code (RGBA, 64 × 64) so the five looks stay one family and
//! cannot drift from their meaning. Each look differs from every other in shape AND colour,
//! so it reads for people who cannot tell the colours apart and on monochrome panels:
//!
//! | look     | shape                      | colour | mark          |
//! |----------|----------------------------|--------|---------------|
//! | healthy  | rounded square (the brand) | green  | fence `#`     |
//! | degraded | triangle, point up         | amber  | `!`           |
//! | down     | octagon (a stop sign)      | red    | `×`           |
//! | no nodes | hollow rounded square      | grey   | small fence   |
//! | paused   | circle                     | blue   | pause bars    |
//!
//! The brand is the app icon's fence (`icons/icon.png`: a white `#` on a green rounded square).

use crate::look::Icon;

pub const SIZE: u32 = 64;

const GREEN: [u8; 3] = [0x2e, 0x7d, 0x4f];
const AMBER: [u8; 3] = [0xe8, 0xa3, 0x17];
const RED: [u8; 3] = [0xc6, 0x28, 0x28];
const GREY: [u8; 3] = [0x8a, 0x94, 0x9e];
const BLUE: [u8; 3] = [0x1e, 0x6f, 0xd9];
const WHITE: [u8; 3] = [0xff, 0xff, 0xff];
const INK: [u8; 3] = [0x2a, 0x1f, 0x00];

/// A point set in the unit square [-1, 1]²: the shape of a layer.
type Shape = fn(f32, f32) -> bool;

/// The layers of `icon`, bottom first: (shape, colour).
fn layers(icon: Icon) -> Vec<(Shape, [u8; 3])> {
    match icon {
        Icon::Healthy => vec![(rounded_square, GREEN), (fence, WHITE)],
        Icon::Degraded => vec![(triangle, AMBER), (exclamation, INK)],
        Icon::Down => vec![(octagon, RED), (cross, WHITE)],
        Icon::NoNodes => vec![(ring_square, GREY), (small_fence, GREY)],
        Icon::Paused => vec![(circle, BLUE), (pause_bars, WHITE)],
    }
}

/// `icon` as straight RGBA, `SIZE` × `SIZE`, anti-aliased by 4 × 4 supersampling.
pub fn rgba(icon: Icon) -> Vec<u8> {
    let layers = layers(icon);
    let mut out = Vec::with_capacity((SIZE * SIZE * 4) as usize);
    const SUB: u32 = 4;
    for py in 0..SIZE {
        for px in 0..SIZE {
            let (mut acc, mut cover) = ([0f32; 3], 0u32);
            for sy in 0..SUB {
                for sx in 0..SUB {
                    let x = ((px * SUB + sx) as f32 + 0.5) / (SIZE * SUB) as f32 * 2.0 - 1.0;
                    let y = ((py * SUB + sy) as f32 + 0.5) / (SIZE * SUB) as f32 * 2.0 - 1.0;
                    if let Some(c) = layers.iter().rev().find(|(shape, _)| shape(x, y)).map(|(_, c)| c) {
                        cover += 1;
                        acc.iter_mut().zip(c).for_each(|(a, &v)| *a += v as f32);
                    }
                }
            }
            if cover == 0 {
                out.extend_from_slice(&[0, 0, 0, 0]);
            } else {
                out.extend(acc.iter().map(|a| (a / cover as f32).round() as u8));
                out.push((cover * 255 / (SUB * SUB)) as u8);
            }
        }
    }
    out
}

/// `icon` as a PNG file (for the test hook's state dir and the README).
pub fn png(icon: Icon) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, SIZE, SIZE);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header()?.write_image_data(&rgba(icon))?;
    Ok(out)
}

fn rounded_square(x: f32, y: f32) -> bool {
    let (r, h) = (0.32, 0.92);
    let (dx, dy) = ((x.abs() - (h - r)).max(0.0), (y.abs() - (h - r)).max(0.0));
    x.abs() <= h && y.abs() <= h && dx * dx + dy * dy <= r * r
}

fn ring_square(x: f32, y: f32) -> bool {
    let inner = |x: f32, y: f32| {
        let (r, h) = (0.2, 0.72);
        let (dx, dy) = ((x.abs() - (h - r)).max(0.0), (y.abs() - (h - r)).max(0.0));
        x.abs() <= h && y.abs() <= h && dx * dx + dy * dy <= r * r
    };
    rounded_square(x, y) && !inner(x, y)
}

fn triangle(x: f32, y: f32) -> bool {
    // Apex at the top centre, base along the bottom.
    let (top, bottom) = (-0.9, 0.86);
    y >= top && y <= bottom && x.abs() <= (y - top) / (bottom - top) * 0.98
}

fn octagon(x: f32, y: f32) -> bool {
    let r = 0.94;
    x.abs() <= r && y.abs() <= r && x.abs() + y.abs() <= r * 1.42
}

fn circle(x: f32, y: f32) -> bool {
    x * x + y * y <= 0.93 * 0.93
}

/// The brand's fence: two posts and two rails, a `#`.
fn fence(x: f32, y: f32) -> bool {
    let bar = |v: f32, at: f32| (v - at).abs() <= 0.09;
    let span = x.abs() <= 0.6 && y.abs() <= 0.6;
    span && (bar(x, -0.27) || bar(x, 0.27) || bar(y, -0.22) || bar(y, 0.22))
}

fn small_fence(x: f32, y: f32) -> bool {
    fence(x / 0.7, y / 0.7)
}

fn exclamation(x: f32, y: f32) -> bool {
    let stem = x.abs() <= 0.1 && (-0.38..=0.34).contains(&y);
    let dot = x * x + (y - 0.56).powi(2) <= 0.12 * 0.12;
    stem || dot
}

fn cross(x: f32, y: f32) -> bool {
    let arm = |a: f32, b: f32| (a - b).abs() <= 0.17 && a.abs() <= 0.48 && b.abs() <= 0.48;
    arm(x, y) || arm(x, -y)
}

fn pause_bars(x: f32, y: f32) -> bool {
    y.abs() <= 0.44 && ((x + 0.2).abs() <= 0.1 || (x - 0.2).abs() <= 0.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The primary colour of `icon` (its background shape).
    fn colour(icon: Icon) -> [u8; 3] {
        layers(icon)[0].1
    }

    const ALL: [Icon; 5] = [Icon::Healthy, Icon::Degraded, Icon::Down, Icon::NoNodes, Icon::Paused];

    /// Which pixels an icon covers at all: its silhouette.
    fn mask(icon: Icon) -> Vec<bool> {
        rgba(icon).chunks(4).map(|p| p[3] > 127).collect()
    }

    #[test]
    fn every_look_has_its_own_silhouette() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                let (ma, mb) = (mask(*a), mask(*b));
                let differ = ma.iter().zip(&mb).filter(|(x, y)| x != y).count();
                // At least 3 % of the pixels: visible at a 22 px tray size.
                assert!(differ * 100 >= ma.len() * 3, "{a:?} and {b:?} share a shape ({differ} px differ)");
            }
        }
    }

    #[test]
    fn every_look_has_its_own_colour() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                let (ca, cb) = (colour(*a), colour(*b));
                let dist: i32 = ca.iter().zip(&cb).map(|(x, y)| (*x as i32 - *y as i32).abs()).sum();
                assert!(dist >= 90, "{a:?} and {b:?} are too close in colour ({dist})");
            }
        }
    }

    #[test]
    fn icons_are_square_rgba_with_a_transparent_corner_and_the_colour_inside() {
        for icon in ALL {
            let px = rgba(icon);
            assert_eq!(px.len(), (SIZE * SIZE * 4) as usize);
            assert_eq!(px[3], 0, "{icon:?}: the corner is transparent");
            // A pixel near the left edge at mid height shows the shape's colour.
            let at = |x: u32, y: u32| &px[((y * SIZE + x) * 4) as usize..][..3];
            let edge = (0..SIZE / 2).map(|x| at(x, SIZE * 3 / 4)).find(|p| p.iter().any(|&v| v > 0));
            assert!(edge.is_some(), "{icon:?} draws something");
            assert_eq!(&png(icon).expect("png")[1..4], b"PNG");
        }
    }
}

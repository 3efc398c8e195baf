//! The TCP store's request and reply frames: the first byte picks which
//! decoder gets the rest. Checked: no panic, and whatever decodes encodes
//! back to the same bytes (the format has one encoding per message).

use crate::store::tcp::fuzzing::{Request, Response, FRAME_HEADER};

pub fn store_codec(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let mut frame = Vec::new();
    if which & 1 == 0 {
        if let Ok(request) = Request::decode(body) {
            request.encode_frame(&mut frame);
            assert_eq!(
                &frame[FRAME_HEADER..],
                body,
                "{request:?} re-encodes differently"
            );
        }
    } else if let Ok(response) = Response::decode(body) {
        response.encode_frame(&mut frame);
        assert_eq!(
            &frame[FRAME_HEADER..],
            body,
            "{response:?} re-encodes differently"
        );
    }
}

"""The image rules of OpenAI Chat Completions and Anthropic Messages, for the strict fakes
(tests/model_api_rules.py): images are decoded as the services decode them (Pillow), so an image the real
API would refuse (the wrong type, undecodable, too large, too many) is refused here with the real message.

OpenAI: a `data:` URL of image/png, image/jpeg, image/gif or image/webp whose base64 decodes to a PNG,
JPEG, WebP or non-animated GIF of at most 20 MB; at most 500 images and 50 MB of them in one request.
Anthropic: base64 of at most 5,242,880 characters, a picture of exactly its declared media type, at most
8000 px a side (2000 px when the request holds more than 20 images), at most 100 images in a request.
Messages marked "(fake's wording)" are this fake's; the others are the services' own, as quoted in public
bug reports.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from typing import Any

OPENAI_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
OPENAI_IMAGE_MAX = 20 * 1024 * 1024
OPENAI_IMAGES_MAX = 500
OPENAI_IMAGE_BYTES_MAX = 50 * 1024 * 1024
OPENAI_BAD_IMAGE = ("You uploaded an unsupported image. Please make sure your image is below 20 MB in size and is of"
                    " one the following formats: ['png', 'jpeg', 'gif', 'webp'].")
ANTHROPIC_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
ANTHROPIC_IMAGE_B64_MAX = 5 * 1024 * 1024
ANTHROPIC_IMAGES_MAX = 100
ANTHROPIC_REQUEST_MAX = 32 * 1024 * 1024  # the Messages API's request size limit (413 request_too_large)
_PIL_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}


def picture(data: bytes) -> tuple[str, int, int, bool] | None:
    """(media type, width, height, animated) of an image the APIs could decode, or None."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.verify() if im.format == "PNG" else im.load()
            return (_PIL_TYPES.get(im.format or "", f"image/{(im.format or 'unknown').lower()}"), im.size[0],
                    im.size[1], bool(getattr(im, "is_animated", False)))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def _b64(text: Any) -> bytes | None:
    if not isinstance(text, str):
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


_DATA_URL = re.compile(r"^data:(?P<mime>[^;,]*)(?P<b64>;base64)?,(?P<data>.*)$", re.DOTALL)


def openai_image_problem(messages: list) -> tuple[str, str | None, str | None] | None:
    """(message, param, code) of the first image part OpenAI's image service refuses, or None (after the
    message checks: every part is well formed)."""
    count, total = 0, 0
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if not (isinstance(part, dict) and part.get("type") == "image_url"):
                continue
            url = part["image_url"]["url"]
            at = f"messages[{i}].content[{j}].image_url.url"
            count += 1
            if count > OPENAI_IMAGES_MAX:  # (fake's wording)
                return (f"Invalid 'messages': too many images. Expected at most {OPENAI_IMAGES_MAX} images in a"
                        " request.", "messages", "too_many_images")
            if url.startswith(("http://", "https://")):
                continue  # fetched by the service; the providers never send one
            found = _DATA_URL.match(url)
            if found is None or not found["b64"]:  # (fake's wording)
                return (f"Invalid '{at}'. Expected a base64-encoded data URL with an image MIME type (e.g."
                        " 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got a value that is not one.", at,
                        "invalid_value")
            if found["mime"] not in OPENAI_IMAGE_TYPES:
                return (f"Invalid '{at}'. Expected a base64-encoded data URL with an image MIME type (e.g."
                        " 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got unsupported MIME type"
                        f" '{found['mime']}'.", at, "invalid_value")
            raw = _b64(found["data"])
            seen = picture(raw) if raw is not None else None
            if raw is None or seen is None or seen[0] not in OPENAI_IMAGE_TYPES or seen[3] \
                    or len(raw) > OPENAI_IMAGE_MAX:
                return (OPENAI_BAD_IMAGE, None, "invalid_image_format")
            total += len(raw)
            if total > OPENAI_IMAGE_BYTES_MAX:  # (fake's wording)
                return (f"Invalid 'messages': the images of this request add up to more than"
                        f" {OPENAI_IMAGE_BYTES_MAX // (1024 * 1024)} MB.", "messages", "images_too_large")
    return None


def anthropic_image_problem(images: list[tuple[int, int, dict]]) -> str | None:
    """Why the API refuses these base64 image blocks ((message index, block index, block)), or None: their
    size, type, dimensions, and how many the request holds."""
    if len(images) > ANTHROPIC_IMAGES_MAX:  # (fake's wording)
        return f"messages: too many images in the request: {len(images)} > {ANTHROPIC_IMAGES_MAX}"
    edge, many = (2000, " for many-image requests") if len(images) > 20 else (8000, "")
    for i, j, b in images:
        at = f"messages.{i}.content.{j}.image.source.base64"
        data, declared = b["source"]["data"], b["source"]["media_type"]
        if len(data) > ANTHROPIC_IMAGE_B64_MAX:
            return f"{at}: image exceeds 5 MB maximum: {len(data)} bytes > {ANTHROPIC_IMAGE_B64_MAX} bytes"
        raw = _b64(data)
        seen = picture(raw) if raw is not None else None
        if seen is None:  # (fake's wording)
            return f"{at}.data: Could not process image"
        if seen[0] != declared:
            return f"{at}.data: Image does not match the provided media type {declared}"
        if max(seen[1], seen[2]) > edge:
            return f"{at}.data: At least one of the image dimensions exceed max allowed size{many}: {edge} pixels"
    return None

#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets: a few small valid inputs per target, in
tests/fuzz/corpus/<target>/. Needs protoc (the manifests). Run from anywhere; rewrites the
generated seeds in place."""
import gzip
import json
import os
import struct
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


# ---- IDX
def idx(code, dims, payload):
    return bytes([0, 0, code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload

put("idx", "u8_1d", idx(0x08, [3], bytes([1, 2, 3])))
put("idx", "u8_3d", idx(0x08, [2, 2, 2], bytes(range(8))))
put("idx", "f32", idx(0x0D, [2], struct.pack(">ff", 1.5, -2.0)))
put("idx", "i16_2d", idx(0x0B, [1, 2], struct.pack(">hh", -7, 300)))
put("idx", "f64_empty", idx(0x0E, [0], b""))
put("idx", "u8_gz", gzip.compress(idx(0x08, [4], bytes([9, 8, 7, 6])), mtime=0))

# ---- token shards
def shard(tokens):
    header = struct.pack("<3i", 20240520, 1, len(tokens)) + bytes(4 * 253)
    return header + struct.pack("<%dH" % len(tokens), *tokens)

put("token_shard", "five", shard([50256, 15496, 995, 0, 65535]))
put("token_shard", "empty", shard([]))

# ---- CIFAR-10
def record(label, seed):
    return bytes([label]) + bytes((seed * 31 + i * 7) % 256 for i in range(3072))

put("cifar", "one_record", record(3, 1))
put("cifar", "two_records", record(0, 2) + record(9, 3))
put("cifar", "batches_meta",
    "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n")

# ---- safetensors
def safetensors(entries, metadata=None):
    header, data = {}, b""
    for name, dtype, shape, payload in entries:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data

put("safetensors", "two", safetensors(
    [("weight", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
     ("step", "I64", [], struct.pack("<q", 7)),
     ("mask", "BOOL", [3], bytes([1, 0, 1]))], {"format": "pt"}))
put("safetensors", "bf16", safetensors([("x", "BF16", [1, 3], bytes(6))]))
put("safetensors", "empty", safetensors([]))

# ---- images
def png(width, height, color_type, depth, rows):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + row for row in rows)
    return (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))

put("image", "rgb_2x2.png", png(2, 2, 2, 8, [bytes([255, 0, 0, 0, 255, 0]),
                                             bytes([0, 0, 255, 9, 9, 9])]))
put("image", "grey_3x1.png", png(3, 1, 0, 8, [bytes([0, 128, 255])]))
put("image", "rgba16_1x1.png", png(1, 1, 6, 16, [bytes([1, 2, 3, 4, 5, 6, 255, 255])]))
put("image", "rgb_2x2.ppm", b"P6\n2 2\n255\n" + bytes(range(12)))
put("image", "grey_2x1.pgm", b"P5 2 1 255\n" + bytes([10, 200]))
bmp_pixels = bytes([0, 0, 255, 0, 255, 0]) + bytes(2)  # one row of 2 BGR pixels, padded to 4
put("image", "rgb_2x1.bmp", b"BM" + struct.pack("<IHHI", 54 + len(bmp_pixels), 0, 0, 54) +
    struct.pack("<IiiHHIIiiII", 40, 2, 1, 1, 24, 0, len(bmp_pixels), 2835, 2835, 0, 0) +
    bmp_pixels)
# The JPEG seed, corpus/image/python.jpg (a 543-byte baseline JPEG from CPython's test data,
# Lib/test/imghdrdata/python.jpg), is kept as is: this script has no JPEG encoder.

# ---- ModelSpec text
put("model_spec", "lenet.prototxt", """name: "lenet"
input { shape: [1, 28, 28] }
layer { name: "conv1" type: "conv2d" conv2d { out_channels: 6 kernel_size: 5 padding: 2 } }
layer { name: "bn1" type: "batch_norm" }
layer { name: "relu1" type: "relu" }
layer { name: "pool1" type: "max_pool2d" pool { kernel_size: 2 } }
layer { name: "pool2" type: "avg_pool2d" pool { kernel_size: 2 stride: 1 padding: 1 ceil_mode: true } }
layer { name: "flatten" type: "flatten" }
layer { name: "fc1" type: "linear" linear { out_features: 12 } }
layer { type: "gelu" }
layer { type: "dropout" }
layer { name: "fc2" type: "linear" linear { out_features: 10 } }
""")
put("model_spec", "resnet.prototxt", """name: "tiny_resnet"
input { shape: [3, 8, 8] }
layer { name: "stem" type: "conv2d" conv2d { out_channels: 4 } }
layer { name: "block" type: "resnet_block" resnet_block { planes: 4 stride: 2 } }
layer { name: "neck" type: "resnet_block" resnet_block { planes: 2 bottleneck: true } }
layer { name: "gap" type: "adaptive_avg_pool2d" }
layer { type: "flatten" }
layer { name: "head" type: "linear" linear { out_features: 3 } }
""")
put("model_spec", "gpt.prototxt", """name: "tiny_gpt"
input { shape: [8] dtype: "i64" }
layer { name: "embed" type: "token_embedding" token_embedding { vocab_size: 16 width: 8 max_positions: 8 } }
layer { name: "block0" type: "transformer_block" transformer_block { heads: 2 } }
layer { name: "ln_f" type: "layer_norm" }
layer { name: "head" type: "lm_head" lm_head { vocab_size: 16 tied_to: "embed" } }
""")

# ---- checkpoint manifests: payload (framed by the target) + a tensor file (see the target)
def tensor_file(payload_bytes):
    size = 64 + (payload_bytes + 63) // 64 * 64
    h = b"STRATATN" + struct.pack("<IIQI", 1, 64, size, 1)
    h += struct.pack("<I", crc32c(h))
    return (h + bytes(64 - len(h))) + bytes(range(payload_bytes)) + bytes(size - 64 - payload_bytes)

def manifest(text):
    proto = os.path.join(ROOT, "io", "proto", "strata.proto")
    return subprocess.run(["protoc", "-I", ROOT, "--encode=strata.proto.CheckpointManifest",
                           proto], input=text.encode(), capture_output=True, check=True).stdout

tfile = tensor_file(16)
put("checkpoint_manifest", "one_tensor", manifest("""format_version: 1 step: 12
model { name: "m" input { shape: [4] } layer { name: "fc" type: "linear" linear { out_features: 1 } } }
file { file: "tensors/t.bin" layer: "fc" bytes: %d }
tensor { layer: "fc" name: "weight" kind: "param" dtype: "f32" shape: [1, 4]
         file: "tensors/t.bin" offset: 64 bytes: 16 crc32c: 0 }
created_at: "2024-01-01T00:00:00Z" reason: "final"
""" % len(tfile)) + tfile)
put("checkpoint_manifest", "no_files", manifest("format_version: 1 step: 0\n"))
put("checkpoint_manifest", "raw_frame", b"STRATAMF" + struct.pack("<IIQ", 1, crc32c(b""), 0))

# ---- BPE: text for the real vocabulary
put("bpe", "english", "Hello world! It's a test of GPT-2's tokenizer, 123 and 4567.\n\n  ok")
put("bpe", "unicode", "Café naïve 日本語 😀 \t\r\n <|endoftext|>")
put("bpe", "invalid_utf8", b"abc\xff\xfe\xc3(\xe2\x82 x\x00y")

# ---- BPE vocabularies: encoder.json (GPT-2's byte alphabet) then vocab.bpe
def byte_alphabet():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

alphabet = byte_alphabet()
encoder = {alphabet[b]: b for b in range(256)}
merges = [("H", "e"), ("l", "l"), ("He", "ll"), ("\u0120", "w")]
for left, right in merges:
    encoder[left + right] = len(encoder)
encoder["<|endoftext|>"] = len(encoder)
put("bpe_vocab", "bytes_and_merges",
    json.dumps(encoder) + "\n#version: 0.2\n" + "".join("%s %s\n" % m for m in merges))

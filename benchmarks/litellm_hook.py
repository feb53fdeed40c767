"""Per-image cost of the LiteLLM image-rewrite hook (vlm_gateway.integrations.litellm_hook):
a cache miss (decode + trim + resize + encode in the hook's pool) and a hit (base64 decode +
sha256 + lookup), for 8 distinct synthetic JPEGs per size, one rewrite worker.

    python benchmarks/litellm_hook.py
"""
import asyncio
import base64
import io
import os
import statistics
import time

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"]="True"; os.environ["LITELLM_TELEMETRY"]="False"
from PIL import Image, ImageDraw
from vlm_gateway.integrations.litellm_hook import ImageRewriteHook
def photo(w,h,seed):
    im = Image.linear_gradient("L").resize((w,h)).convert("RGB"); d=ImageDraw.Draw(im)
    for i in range(0,w,max(1,w//8)): d.rectangle([i+seed,h//4,i+w//16,h//2],fill=(30,120,(200+seed)%255))
    b=io.BytesIO(); im.save(b,"JPEG",quality=90); return "data:image/jpeg;base64,"+base64.b64encode(b.getvalue()).decode()
async def main():
    hook = ImageRewriteHook({}, workers=1)
    for (w,h) in [(1920,1080),(4032,3024)]:
        uris=[photo(w,h,s) for s in range(8)]
        miss=[];hit=[]
        for u in uris:
            d={"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":u}}]}]}
            t=time.perf_counter(); await hook.rewrite_request(d); miss.append((time.perf_counter()-t)*1000)
            d={"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":u}}]}]}
            t=time.perf_counter(); await hook.rewrite_request(d); hit.append((time.perf_counter()-t)*1000)
        print(f"{w}x{h} JPEG {len(uris[0])//1024} KiB b64: miss median {statistics.median(miss):.1f} ms (max {max(miss):.1f}), cache hit median {statistics.median(hit):.2f} ms")
asyncio.run(main())

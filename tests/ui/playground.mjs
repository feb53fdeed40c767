// Drive the /ui playground in headless Chromium: upload an image, ask, wait for the
// streamed answer; then open the status view. Prints one JSON object of what the
// page showed. Usage: node playground.mjs BASE_URL IMAGE_PATH OUT_DIR [KEY]
import { chromium } from "playwright-core";

const [base, imagePath, outDir, key] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const result = {};
try {
  const page = await browser.newPage({ viewport: { width: 1180, height: 1000 } });
  page.on("console", (m) => { if (m.type() === "error") (result.console_errors ||= []).push(m.text()); });
  await page.goto(base + "/ui/");
  await page.waitForSelector("body[data-ready='1']");
  if (key) { await page.fill("#key", key); await page.dispatchEvent("#key", "change"); }
  result.models = await page.$$eval("#model option", (os) => os.map((o) => o.value));
  await page.setInputFiles("#file", imagePath);
  await page.waitForFunction(() => !document.getElementById("run").disabled);
  await page.fill("#question", "What is in this picture?");
  // Record every change of the answer text: a streamed answer grows in many steps.
  await page.evaluate(() => {
    window.__growth = [];
    new MutationObserver(() => window.__growth.push([performance.now(), document.getElementById("answer").textContent.length]))
      .observe(document.getElementById("answer"), { childList: true, characterData: true, subtree: true });
  });
  await page.click("#run");
  await page.waitForFunction(() => document.getElementById("answer-state").textContent === "done" ||
                                    document.getElementById("error").textContent !== "", null, { timeout: 60000 });
  const text = (id) => page.textContent("#" + id);
  const data = (id) => page.$eval("#" + id, (e) => Number(e.dataset.value));
  Object.assign(result, {
    error: await text("error"),
    size_before: await text("size-before"), size_after: await text("size-after"),
    bytes_before: await data("bytes-before"), bytes_after: await data("bytes-after"),
    tokens_before: await data("tokens-before"), tokens_after: await data("tokens-after"),
    saving: await text("saving"), answer: await text("answer"), answer_meta: await text("answer-meta"),
    chunks: await page.$eval("#answer", (e) => Number(e.dataset.chunks || 0)),
    growth: await page.evaluate(() => window.__growth),
    after_image_natural: await page.$eval("#img-after", (i) => [i.naturalWidth, i.naturalHeight]),
    frame_after: await text("frame-after"), grounding_after: await text("grounding-after"),
    transform_header: await page.$eval("#frame-after", (e) => e.dataset.value),
  });
  await page.screenshot({ path: outDir + "/playground.png", fullPage: true });

  await page.goto(base + "/ui/#status");
  await page.waitForFunction(() => document.querySelector("#recent tbody tr td") &&
                                    document.querySelector("#recent tbody td").textContent !== "none yet");
  result.status = {
    backends: await page.$$eval("#backends tbody tr", (rs) => rs.map((r) => [...r.cells].map((c) => c.textContent))),
    recent: await page.$$eval("#recent tbody tr", (rs) => rs.map((r) => [...r.cells].map((c) => c.textContent))),
    totals: await page.textContent("#image-totals"),
  };
  await page.screenshot({ path: outDir + "/status.png", fullPage: true });
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));

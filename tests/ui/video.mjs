// Drive the /ui playground in headless Chromium with a video: upload it, ask, wait for the
// streamed answer. Prints one JSON object of what the page showed.
// Usage: node video.mjs BASE_URL VIDEO_PATH OUT_DIR
import { chromium } from "playwright-core";

const [base, videoPath, outDir] = process.argv.slice(2);
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
  await page.setInputFiles("#file", videoPath);
  await page.waitForFunction(() => !document.getElementById("run").disabled);
  result.question_default = await page.inputValue("#question");
  await page.fill("#question", "What changes on the screen?");
  await page.click("#run");
  await page.waitForFunction(() => document.getElementById("answer-state").textContent === "done" ||
                                    document.getElementById("error").textContent !== "", null, { timeout: 60000 });
  const text = (id) => page.textContent("#" + id);
  const data = (id) => page.$eval("#" + id, (e) => Number(e.dataset.value));
  Object.assign(result, {
    error: await text("error"),
    video_shown: await page.$eval("#video-before", (v) => !v.hidden && v.src.startsWith("data:video/")),
    image_hidden: await page.$eval("#img-before", (i) => i.hidden),
    after_src: await page.$eval("#video-after", (v) => v.getAttribute("src") || ""),
    size_before: await text("size-before"), size_after: await text("size-after"),
    frames_before: await text("frames-before"), frames_after: await text("frames-after"),
    bytes_before: await data("bytes-before"), bytes_after: await data("bytes-after"),
    tokens_before: await data("tokens-before"), tokens_after: await data("tokens-after"),
    saving: await text("saving"), answer: await text("answer"), answer_meta: await text("answer-meta"),
  });
  result.after_src = result.after_src.slice(0, 40);
  await page.screenshot({ path: outDir + "/playground-video.png", fullPage: true });
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));

// A Hocuspocus server for bench/peer_hocuspocus/run.py: in-memory documents (no extension),
// on 127.0.0.1 and a free port; prints `PORT <n>` and stops when its stdin closes.
import { Server } from '@hocuspocus/server';

const server = new Server({ port: 0, address: '127.0.0.1', quiet: true, stopOnSignals: false });
await server.listen();
process.stdout.write(`PORT ${server.address.port}\n`);
process.stdin.on('close', async () => {
  await server.destroy();
  process.exit(0);
});
process.stdin.resume();

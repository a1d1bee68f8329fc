// A @grpc/grpc-js server for bench/grpc_other_servers.py (docs/decisions/0105): the methods of
// bench/grpc_floor.py's server, answered from bytes.
//
//   node server.js PORT                 Empty answers 10 bytes, Stream streams 34 of 300
//   node server.js PORT FORWARD_PORT    Empty POSTs its request to 127.0.0.1:FORWARD_PORT over
//                                       a keep-alive HTTP/1.1 connection and answers the body
//
// It prints its port once it listens, as grpc_floor.py's server does.
"use strict";

const grpc = require("@grpc/grpc-js");
const http = require("node:http");

const SERVICE = "txhub.bench.Floor"; // grpc_floor.SERVICE
const ANSWER = Buffer.alloc(300, "x"); // grpc_floor.ANSWER
const STREAMED = 34; // grpc_floor.STREAMED
const asBytes = { serialize: (value) => value, deserialize: (bytes) => bytes };

function method(name, responseStream) {
  return {
    path: `/${SERVICE}/${name}`,
    requestStream: false,
    responseStream,
    requestSerialize: asBytes.serialize,
    requestDeserialize: asBytes.deserialize,
    responseSerialize: asBytes.serialize,
    responseDeserialize: asBytes.deserialize,
  };
}

function forwarder(port) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
  return (call, callback) => {
    const request = http.request(
      {
        agent,
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/call",
        headers: { "content-length": call.request.length },
      },
      (response) => {
        const chunks = [];
        response.on("data", (chunk) => chunks.push(chunk));
        response.on("end", () => callback(null, Buffer.concat(chunks)));
      },
    );
    request.on("error", (error) =>
      callback({ code: grpc.status.UNAVAILABLE, details: error.message }),
    );
    request.end(call.request);
  };
}

function main() {
  const port = Number(process.argv[2]);
  const forwardPort = process.argv[3] ? Number(process.argv[3]) : null;
  const empty = forwardPort
    ? forwarder(forwardPort)
    : (call, callback) => callback(null, ANSWER.subarray(0, 10));
  const stream = (call) => {
    for (let i = 0; i < STREAMED; i += 1) call.write(ANSWER);
    call.end();
  };
  const server = new grpc.Server();
  server.addService(
    { Empty: method("Empty", false), Stream: method("Stream", true) },
    { Empty: empty, Stream: stream },
  );
  server.bindAsync(`127.0.0.1:${port}`, grpc.ServerCredentials.createInsecure(), (error, bound) => {
    if (error) {
      console.error(error.message);
      process.exit(1);
    }
    console.log(bound);
  });
  process.on("SIGTERM", () => {
    server.forceShutdown();
    process.exit(0);
  });
}

main();
